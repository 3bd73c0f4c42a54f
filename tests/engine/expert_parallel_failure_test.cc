// A failed rank of a CPU expert-parallel group (ThreadRankPeers): the step it fails in fails its
// requests with the rank and the cause, the failure is reported once (the rank that failed first,
// not the ranks whose collectives threw because of it), and the group stays down: every later step
// fails at once with the same cause; those requests are marked unavailable (the instance's failure: a
// 503). Rank 0's own failure (its step unwinding) is reported as rank 0.
#include "engine_test_support.h"

namespace beluga::engine_test {
namespace {

TEST_F(EngineTest, AFailedExpertParallelRankFailsItsStepAndTheGroupStaysDown) {
  // Rank 1 throws from its 4th step: the first request (a prefill and one decode step) finishes.
  ExpertParallelPair pair(cfg_, *ckpt_, 2048, InjectedRankFault{1, 4});
  int reports = 0;
  RankFailure reported;
  pair.peers->on_failure([&](const RankFailure& f) {
    ++reports;
    reported = f;
  });
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*pair.model, ec);
  const std::vector<int> p1 = prompt(12, 1), p2 = prompt(15, 2);
  ASSERT_EQ(engine.submit(greedy("ok", p1, 2, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  EXPECT_EQ(c.finish["ok"][0], FinishReason::kLength);
  EXPECT_EQ(c.tokens["ok"][0], reference(p1, 2));  // two ranks compute what one does
  EXPECT_FALSE(pair.peers->failure());
  EXPECT_EQ(pair.group.failed_rank(), -1);

  ASSERT_EQ(engine.submit(greedy("hit", p2, 8, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(2));
  EXPECT_EQ(c.finish["hit"][0], FinishReason::kError);
  EXPECT_NE(c.error["hit"].find("expert-parallel rank 1 failed: injected failure of rank 1 at its step 4"),
            std::string::npos)
      << c.error["hit"];
  EXPECT_TRUE(c.unavailable["hit"]);  // the instance's failure, not the request's: a 503
  ASSERT_TRUE(pair.peers->failure());
  EXPECT_EQ(pair.peers->failure()->rank, 1);
  EXPECT_EQ(pair.group.failed_rank(), 1);
  EXPECT_EQ(reports, 1);
  EXPECT_EQ(reported.rank, 1);
  EXPECT_NE(reported.cause.find("injected failure of rank 1"), std::string::npos) << reported.cause;

  // The group is down for good: a later request fails at once, naming the first failure.
  ASSERT_EQ(engine.submit(greedy("later", p1, 4, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(3));
  EXPECT_EQ(c.finish["later"][0], FinishReason::kError);
  EXPECT_NE(c.error["later"].find("expert-parallel rank 1 failed (injected failure of rank 1 at its step 4); "
                                  "the group is down"),
            std::string::npos)
      << c.error["later"];
  EXPECT_TRUE(c.unavailable["later"]);
  EXPECT_FALSE(c.unavailable["ok"]);
  EXPECT_EQ(reports, 1);
}

TEST_F(EngineTest, RankZerosOwnFailureIsReportedAsRankZero) {
  ExpertParallelPair pair(cfg_, *ckpt_, 2048);
  int reports = 0;
  pair.peers->on_failure([&](const RankFailure&) { ++reports; });
  try {  // what Model::with_peers does when rank 0's part of a step throws
    throw std::runtime_error("device lost");
  } catch (...) {
    pair.peers->abort();
  }
  ASSERT_TRUE(pair.peers->failure());
  EXPECT_EQ(pair.peers->failure()->rank, 0);
  EXPECT_EQ(pair.peers->failure()->cause, "device lost");
  EXPECT_EQ(reports, 1);
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*pair.model, ec);
  ASSERT_EQ(engine.submit(greedy("after", prompt(12, 3), 4, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  EXPECT_EQ(c.finish["after"][0], FinishReason::kError);
  EXPECT_NE(c.error["after"].find("expert-parallel rank 0 failed (device lost)"), std::string::npos)
      << c.error["after"];
  EXPECT_EQ(reports, 1);
}

}  // namespace
}  // namespace beluga::engine_test
