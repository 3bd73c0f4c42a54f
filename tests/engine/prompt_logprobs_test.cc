// Prompt logprobs in the engine: every prompt position scored once, through chunked prefill, the
// prefix cache and preemption, equal to one full-prompt pass.
#include "engine_test_support.h"

namespace beluga::engine_test {
namespace {

// Prompt logprobs through chunked prefills (a small token budget splits prompts across steps, and
// across blocks), next to requests without them and with n=2: each request gets exactly one entry
// per prompt token after the first, in its first output, equal to one full-prompt pass; the
// generated tokens are unaffected (these greedy requests would otherwise take the device-argmax
// path, which writes no logits).
TEST_F(EngineTest, PromptLogprobsUnderChunkedPrefillAndConcurrency) {
  Collector c;
  EngineConfig ec;
  ec.max_num_batched_tokens = 48;
  ec.num_kv_blocks = 256;
  Engine engine(*model_, ec);
  const std::vector<int> lengths = {1, 2, 47, 48, 49, 64, 65, 130, 200};
  const std::vector<int> ks = {0, 3, 20, 1, 0, 5, 2, 20, 4};
  std::vector<std::vector<int>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(prompt(lengths[i], 700 + int(i)));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r = with_prompt_lps(greedy(str("pl", i), prompts[i], 6, c), ks[i]);
    if (i % 3 == 1) r.sampling.n = 2;
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
    ASSERT_EQ(engine.submit(greedy(str("plain", i), prompts[(i + 4) % prompts.size()], 8, c)),
              SubmitStatus::kOk);
  }
  ASSERT_TRUE(c.wait(2 * prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = str("pl", i);
    const auto want = reference(prompts[i], 6);
    for (int k = 0; k < (i % 3 == 1 ? 2 : 1); ++k) EXPECT_EQ(c.tokens[id][k], want) << id << " seq " << k;
    EXPECT_EQ(c.tokens[str("plain", i)][0], reference(prompts[(i + 4) % prompts.size()], 8)) << i;
    if (lengths[i] == 1) {
      EXPECT_EQ(c.prompt_lp_outputs[id], 0) << id;  // nothing to score
      continue;
    }
    EXPECT_EQ(c.prompt_lp_outputs[id], 1) << id;
    EXPECT_EQ(c.prompt_lp_at[id], 0) << id;  // with the first token
    expect_prompt_lps(c.prompt_lps[id], prompts[i], ks[i], id);
    EXPECT_EQ(c.prompt_lp_outputs.count(str("plain", i)), 0u);
  }
  EXPECT_EQ(c.late, 0);
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
}

// A prompt already in the prefix cache: a request that wants prompt logprobs computes it anyway (and
// reports every position); its blocks still serve the requests after it.
TEST_F(EngineTest, PromptLogprobsBypassThePrefixCache) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*model_, ec);
  const auto p = prompt(300, 9);  // 4 full blocks + 44 tokens
  ASSERT_EQ(engine.submit(greedy("warm", p, 4, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  ASSERT_EQ(engine.submit(with_prompt_lps(greedy("scored", p, 4, c), 2)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(2));
  EXPECT_EQ(c.cached["warm"], 0);
  EXPECT_EQ(c.cached["scored"], 0);
  EXPECT_EQ(c.tokens["scored"][0], c.tokens["warm"][0]);
  EXPECT_EQ(c.prompt_lp_outputs["scored"], 1);
  expect_prompt_lps(c.prompt_lps["scored"], p, 2, "scored");
  // Twice in a row, n=2: the second sequence may take what the first scored from the cache.
  EngineRequest again = with_prompt_lps(greedy("again", p, 4, c), 0);
  again.sampling.n = 2;
  ASSERT_EQ(engine.submit(std::move(again)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(3));
  EXPECT_EQ(c.prompt_lp_outputs["again"], 1);
  expect_prompt_lps(c.prompt_lps["again"], p, 0, "again");
  EXPECT_EQ(c.tokens["again"][1], c.tokens["warm"][0]);
  ASSERT_EQ(engine.submit(greedy("after", p, 4, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(4));
  EXPECT_EQ(c.cached["after"], 4 * kKvBlockSize);
  EXPECT_EQ(c.tokens["after"][0], c.tokens["warm"][0]);
}

// Preemption in the middle of prefills that score their prompts (8 blocks, a small token budget):
// a recomputed sequence neither skips nor repeats a position, and the prompt logprobs come once.
TEST_F(EngineTest, PromptLogprobsSurvivePreemption) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 8;
  ec.max_model_len = 400;
  ec.max_num_batched_tokens = 40;
  Engine engine(*model_, ec);
  constexpr int kRequests = 8;
  std::vector<std::vector<int>> prompts;
  const auto shared = prompt(64, 78);
  for (int i = 0; i < kRequests; ++i) {
    auto p = prompt(50 + 23 * i, 800 + i);
    if (i % 2 == 0) p.insert(p.begin(), shared.begin(), shared.end());
    prompts.push_back(p);
  }
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r = greedy(str("pp", i), prompts[size_t(i)], 30, c);
    if (i % 4 != 3) r.sampling.prompt_logprobs = i % 3;
    r.sampling.n = i % 3 == 0 ? 2 : 1;
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  }
  ASSERT_TRUE(c.wait(kRequests));
  for (int i = 0; i < kRequests; ++i) {
    const std::string id = str("pp", i);
    const auto want = reference(prompts[size_t(i)], 30);
    for (int k = 0; k < (i % 3 == 0 ? 2 : 1); ++k) EXPECT_EQ(c.tokens[id][k], want) << id << " seq " << k;
    if (i % 4 == 3) continue;
    EXPECT_EQ(c.prompt_lp_outputs[id], 1) << id;
    EXPECT_EQ(c.prompt_lp_at[id], 0) << id;
    expect_prompt_lps(c.prompt_lps[id], prompts[size_t(i)], i % 3, id);
  }
  EXPECT_EQ(c.late, 0);
  const EngineStats st = wait_idle(engine);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

}  // namespace
}  // namespace beluga::engine_test
