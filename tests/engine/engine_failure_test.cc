// The engine loop's failure boundary and its queue limit: an exception escaping a loop iteration
// fails the requests of the steps in hand and the loop goes on; an output callback that throws fails
// its own request only; the queue limit counts sequences, not requests.
#include "engine_test_support.h"

namespace beluga::engine_test {
namespace {

// An exception thrown on the engine thread after step 3's results are applied (the loop hook stands
// in for any bug there: a failed allocation, an assertion, a throwing sampler): the two running
// requests, whose next step was being prepared, fail with the error; the two that were still waiting
// (max_num_seqs = 2) are untouched and finish exactly as a reference run; nothing leaks and a later
// request is served normally.
TEST_F(EngineTest, ExceptionInTheLoopFailsTheStepsRequestsAndTheLoopGoesOn) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  ec.max_num_seqs = 2;
  ec.loop_hook = [](int64_t steps) {
    if (steps == 3) throw std::runtime_error("injected loop failure");
  };
  Engine engine(*model_, ec);
  const auto ps = make_prompts(4, 12, 5, 40);
  ASSERT_TRUE(submit_each(engine, "r", ps, 8, c));
  ASSERT_TRUE(c.wait(4));
  for (int i = 0; i < 2; ++i) {
    const std::string id = str("r", i);
    expect_failed_with_prefix(c, id, reference(ps[size_t(i)], 8));
    EXPECT_NE(c.error[id].find("injected loop failure"), std::string::npos) << c.error[id];
  }
  for (int i = 2; i < 4; ++i) {
    const std::string id = str("r", i);
    EXPECT_EQ(c.finish[id][0], FinishReason::kLength) << id;
    EXPECT_EQ(c.tokens[id][0], reference(ps[size_t(i)], 8)) << id;
  }
  EXPECT_EQ(expect_clean_and_serving(engine, c, ps[0], 8).steps_failed, 1);
}

// A callback that throws on its request's second output: that request ends with an error (its final
// output still reaches the callback), the request beside it in every step finishes as a reference run,
// and no blocks leak.
TEST_F(EngineTest, AThrowingOutputCallbackFailsOnlyItsRequest) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*model_, ec);
  const auto pa = prompt(20, 7), pb = prompt(30, 8);
  EngineRequest a = greedy("A", pa, 10, c);
  int calls = 0;  // engine thread only
  a.on_output = [&, inner = a.on_output](RequestOutput&& o) {
    if (++calls == 2) throw std::runtime_error("callback bug");
    inner(std::move(o));
  };
  ASSERT_EQ(engine.submit(std::move(a)), SubmitStatus::kOk);
  ASSERT_EQ(engine.submit(greedy("B", pb, 10, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(2));
  EXPECT_EQ(c.finish["A"][0], FinishReason::kError);
  EXPECT_NE(c.error["A"].find("could not be delivered"), std::string::npos) << c.error["A"];
  EXPECT_EQ(c.tokens["A"][0], head(reference(pa, 10), 1));  // the first output only
  EXPECT_EQ(c.finish["B"][0], FinishReason::kLength);
  EXPECT_EQ(c.tokens["B"][0], reference(pb, 10));
  EXPECT_EQ(c.late, 0);
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
}

// max_queue_len counts sequences: with the engine held (the gate) a queue of 4 takes a request of
// n = 3 and one of n = 1, refuses one of n = 2 in between (5 > 4), and rejects n = 5 outright (it can
// never fit). Counting requests, as before, let any number of n = 128 requests in.
TEST_F(EngineTest, TheQueueLimitCountsSequences) {
  Collector c;
  Gate gate;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  ec.max_queue_len = 4;
  Engine engine(*model_, ec);
  EngineRequest g = greedy("G", prompt(6, 1), 1, c);
  g.on_output = gate.wrap(g.on_output);
  ASSERT_EQ(engine.submit(std::move(g)), SubmitStatus::kOk);
  ASSERT_TRUE(gate.wait_inside());
  auto with_n = [&](const std::string& id, int n) {
    EngineRequest r = greedy(id, prompt(10, 3), 4, c);
    r.sampling.n = n;
    return r;
  };
  EXPECT_EQ(engine.submit(with_n("n3", 3)), SubmitStatus::kOk);
  EXPECT_EQ(engine.submit(with_n("n2", 2)), SubmitStatus::kQueueFull);
  EXPECT_EQ(engine.submit(with_n("n1", 1)), SubmitStatus::kOk);
  std::string why;
  EXPECT_EQ(engine.submit(with_n("n5", 5), &why), SubmitStatus::kInvalid);
  EXPECT_NE(why.find("never fit"), std::string::npos) << why;
  gate.release();
  ASSERT_TRUE(c.wait(3));
  const auto want = reference(prompt(10, 3), 4);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(c.tokens["n3"][k], want) << k;
  EXPECT_EQ(c.tokens["n1"][0], want);
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
}

}  // namespace
}  // namespace beluga::engine_test
