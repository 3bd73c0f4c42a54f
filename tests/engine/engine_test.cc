// The serving engine on a real checkpoint (the dsv3-tiny fixture): results through continuous
// batching equal the plain generator's, alone and under concurrency; seeded sampling is reproducible
// under load; the prefix cache serves repeated prompts; preemption and aborts lose nothing.
#include "engine_test_support.h"

namespace beluga::engine_test {
namespace {

TEST_F(EngineTest, GreedyEqualsGeneratorAloneAndUnderConcurrency) {
  // 32 concurrent requests of mixed lengths, with prefill chunking across steps (small token budget).
  EngineConfig ec;
  ec.max_num_batched_tokens = 96;
  ec.num_kv_blocks = 256;
  Engine engine(*model_, ec);
  Collector c;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 32; ++i) prompts.push_back(prompt(3 + (i * 37) % 150, i));
  for (int i = 0; i < 32; ++i)
    ASSERT_EQ(engine.submit(greedy(str("r", i), prompts[i], 12, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(32));
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(c.tokens[str("r", i)][0], reference(prompts[i], 12)) << "request " << i;
    EXPECT_EQ(c.finish[str("r", i)][0], FinishReason::kLength);
  }
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, SeededSamplingIsReproducibleUnderLoad) {
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  Engine engine(*model_, ec);
  Collector c;
  auto seeded = [&](const std::string& id) {
    EngineRequest r;
    r.id = id;
    r.prompt = prompt(20, 99);
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 1234;
    r.sampling.max_tokens = 16;
    r.sampling.ignore_eos = true;
    r.sampling.n = 2;
    r.on_output = c.callback();
    return r;
  };
  ASSERT_EQ(engine.submit(seeded("alone")), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  for (int i = 0; i < 10; ++i) engine.submit(greedy(str("noise", i), prompt(5 + 13 * i, i), 20, c));
  ASSERT_EQ(engine.submit(seeded("loaded")), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(12));
  EXPECT_EQ(c.tokens["alone"][0], c.tokens["loaded"][0]);
  EXPECT_EQ(c.tokens["alone"][1], c.tokens["loaded"][1]);
  EXPECT_NE(c.tokens["alone"][0], c.tokens["alone"][1]);  // n=2 gives two different samples
}

TEST_F(EngineTest, RepeatedPromptHitsThePrefixCache) {
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*model_, ec);
  Collector c;
  auto p = prompt(300, 5);  // 4 full blocks + 44 tokens
  engine.submit(greedy("first", p, 4, c));
  ASSERT_TRUE(c.wait(1));
  engine.submit(greedy("second", p, 4, c));
  ASSERT_TRUE(c.wait(2));
  EXPECT_EQ(c.cached["first"], 0);
  EXPECT_EQ(c.cached["second"], 4 * kKvBlockSize);
  EXPECT_EQ(c.tokens["second"][0], c.tokens["first"][0]);
  // Another tenant (salt) gets no hit.
  EngineRequest other = greedy("tenant-b", p, 4, c);
  other.cache_salt = "key-b";
  engine.submit(std::move(other));
  ASSERT_TRUE(c.wait(3));
  EXPECT_EQ(c.cached["tenant-b"], 0);
  EngineStats st = engine.stats();
  EXPECT_EQ(st.prefix_cache_hits, 4 * kKvBlockSize);
  EXPECT_EQ(st.prefix_cache_queries, 900);
}

TEST_F(EngineTest, PreemptionUnderMemoryPressureKeepsResults) {
  // 12 blocks hold 768 tokens; 8 requests of ~150 + 40 tokens need more, so some are preempted and
  // recomputed.
  EngineConfig ec;
  ec.num_kv_blocks = 12;
  ec.max_model_len = 700;
  ec.enable_prefix_caching = false;
  Engine engine(*model_, ec);
  Collector c;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(prompt(120 + 10 * i, 50 + i));
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(engine.submit(greedy(str("p", i), prompts[i], 40, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(8));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.tokens[str("p", i)][0], reference(prompts[i], 40)) << i;
  EXPECT_GT(engine.stats().preemptions, 0);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, AbortFreesBlocksAndQueueLimitsHold) {
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  ec.max_queue_len = 4;
  ec.max_num_seqs = 1;
  Engine engine(*model_, ec);
  Collector c;
  ASSERT_EQ(engine.submit(greedy("long", prompt(100, 1), 2000, c)), SubmitStatus::kPromptTooLong);
  ASSERT_EQ(engine.submit(greedy("long", prompt(100, 1), 1500, c)), SubmitStatus::kOk);
  engine.abort("long");
  int queued = 0;
  for (int i = 0; i < 20; ++i)
    queued += engine.submit(greedy(str("q", i), prompt(10, i), 1500, c)) == SubmitStatus::kOk;
  EXPECT_LT(queued, 20);  // the queue filled up
  EXPECT_GE(queued, 3);
  for (int i = 0; i < 20; ++i) engine.abort(str("q", i));
  ASSERT_TRUE(c.wait(size_t(1 + queued)));
  EXPECT_EQ(c.finish["long"][0], FinishReason::kAbort);
  EngineStats st{};
  for (int i = 0; i < 100 && (st = engine.stats()).kv_blocks_used != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(st.kv_blocks_used, 0);
  // Still serving.
  ASSERT_EQ(engine.submit(greedy("after", prompt(8, 3), 3, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(size_t(2 + queued)));
  EXPECT_EQ(c.tokens["after"][0], reference(prompt(8, 3), 3));
}

TEST_F(EngineTest, RejectsInvalidRequests) {
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*model_, ec);
  Collector c;
  std::string why;
  EXPECT_EQ(engine.submit(greedy("empty", {}, 4, c), &why), SubmitStatus::kInvalid);
  EXPECT_EQ(engine.submit(greedy("vocab", {1, 99999}, 4, c), &why), SubmitStatus::kInvalid);
  EXPECT_NE(why.find("vocabulary"), std::string::npos);
  EXPECT_EQ(engine.submit(greedy("zero", {1, 2}, 0, c), &why), SubmitStatus::kInvalid);
  EXPECT_EQ(engine.submit(with_prompt_lps(greedy("plp21", {1, 2}, 4, c), 21), &why), SubmitStatus::kInvalid);
  EXPECT_EQ(engine.submit(with_prompt_lps(greedy("plp-2", {1, 2}, 4, c), -2), &why), SubmitStatus::kInvalid);
  EXPECT_EQ(engine.submit(with_prompt_lps(greedy("plp20", {1, 2}, 1, c), 20), &why), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
}

}  // namespace
}  // namespace beluga::engine_test
