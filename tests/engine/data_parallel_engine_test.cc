// The engine over attention data-parallel ranks (dsv3-tiny, two CPU thread ranks): requests spread
// over the ranks' block partitions, each rank computing only its sequences, and every request's
// greedy tokens equal one model's; a shared prefix is found again in the partition that holds it.
#include <gtest/gtest.h>

#include <cstring>

#include "engine_test_support.h"

namespace beluga::engine_test {
namespace {

bool any_nonzero(const KvCache& kv) {
  for (const Tensor& t : kv.layers) {
    const auto* p = static_cast<const unsigned char*>(t.data);
    const size_t n = t.nbytes();
    for (size_t i = 0; i < n; ++i)
      if (p[i]) return true;
  }
  return false;
}

TEST_F(EngineTest, DataParallelRanksGenerateWhatOneModelDoes) {
  ExpertParallelPair pair(cfg_, *ckpt_, 2048, {}, true);
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 12;  // per rank: 768 tokens
  ec.max_model_len = 512;
  Engine engine(*pair.model, ec);
  // Two waves: six prompts at once (two share a 130-token prefix), then the shared prefix again.
  const std::vector<int> shared = prompt(130, 9);
  std::vector<std::vector<int>> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(prompt(20 + 37 * i, i + 1));
  for (int i = 0; i < 2; ++i) {
    std::vector<int> p = shared;
    const auto tail = prompt(5 + i, 20 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    ps.push_back(p);
  }
  for (size_t i = 0; i < ps.size(); ++i)
    ASSERT_EQ(engine.submit(greedy("r" + std::to_string(i), ps[i], 8, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(ps.size()));
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::string id = "r" + std::to_string(i);
    EXPECT_EQ(c.finish[id][0], FinishReason::kLength) << c.error[id];
    EXPECT_EQ(c.tokens[id][0], reference(ps[i], 8)) << id;
  }
  // Both ranks computed sequences (rank 1's cache holds KV; a replicated step would fill both too,
  // but replicated steps are refused in this mode).
  EXPECT_TRUE(any_nonzero(pair.peers->kv_of(1)));
  std::vector<int> again = shared;
  const auto tail = prompt(9, 30);
  again.insert(again.end(), tail.begin(), tail.end());
  ASSERT_EQ(engine.submit(greedy("again", again, 6, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(ps.size() + 1));
  EXPECT_EQ(c.tokens["again"][0], reference(again, 6));
  EXPECT_EQ(c.cached["again"], 128) << "the shared prefix's two full blocks, in the rank that holds them";
  EXPECT_EQ(engine.stats().kv_blocks_total, 24);
  // n = 3 greedy sequences of one request (sharing its prompt's blocks): each the reference.
  const std::vector<int> pn = prompt(90, 40);
  ASSERT_EQ(engine.submit(greedy("n3", pn, 5, c, 3)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(ps.size() + 2));
  const std::vector<int> want = reference(pn, 5);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.tokens["n3"][i], want) << "sequence " << i;
}

// Memory pressure over data-parallel ranks: small caches (6 blocks a rank) and ten requests at once,
// so sequences are preempted (only by their own rank's) and recomputed, some on the other rank; every
// request's greedy tokens are still one model's.
TEST_F(EngineTest, DataParallelRanksUnderMemoryPressureGenerateWhatOneModelDoes) {
  ExpertParallelPair pair(cfg_, *ckpt_, 2048, {}, true);
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 6;
  ec.max_model_len = 384;
  Engine engine(*pair.model, ec);
  std::vector<std::vector<int>> ps;
  for (int i = 0; i < 10; ++i) ps.push_back(prompt(30 + (i * 53) % 170, 50 + i));
  for (size_t i = 0; i < ps.size(); ++i)
    ASSERT_EQ(engine.submit(greedy("m" + std::to_string(i), ps[i], 40, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(ps.size()));
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::string id = "m" + std::to_string(i);
    EXPECT_EQ(c.finish[id][0], FinishReason::kLength) << c.error[id];
    EXPECT_EQ(c.tokens[id][0], reference(ps[i], 40)) << id;
  }
  const EngineStats st = wait_idle(engine);
  EXPECT_GT(st.preemptions, 0) << "the caches were meant to run out";
  EXPECT_EQ(st.kv_blocks_used, 0);
}

// The engine takes its caches from the model's step peers: one cache over replicated ranks (each rank
// holds a copy), one a rank over data-parallel ranks.
TEST_F(EngineTest, DataParallelCachesFollowTheStepPeers) {
  EngineConfig ec;
  ec.num_kv_blocks = 8;
  ec.max_model_len = 256;
  ExpertParallelPair replicated(cfg_, *ckpt_, 2048);
  {
    Engine e(*replicated.model, ec);
    EXPECT_EQ(e.stats().kv_blocks_total, 8);
    EXPECT_TRUE(e.stats().kv_blocks_used_by_rank.empty());
  }
  ExpertParallelPair dp(cfg_, *ckpt_, 2048, {}, true);
  Engine e(*dp.model, ec);
  EXPECT_EQ(e.stats().kv_blocks_total, 16);
  EXPECT_EQ(e.stats().kv_blocks_used_by_rank, (std::vector<int>{0, 0}));
}

}  // namespace
}  // namespace beluga::engine_test
