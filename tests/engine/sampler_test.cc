// Sampler: each parameter's effect on hand-made logits, and seeded determinism.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sampler.h"

namespace beluga {
namespace {

struct Fixture {
  std::vector<int> prompt = {1, 2};
  std::unordered_map<int, int> counts;
  std::vector<int> stops = {0};
  std::vector<float> scratch;
  std::vector<int> idx;
  int num_output = 0;

  SampleResult run(std::vector<float> logits, const SamplingParams& p, uint64_t seed = 1, int index = 0) {
    SampleContext ctx{&p, &prompt, &counts, num_output, &stops, seed, index};
    return sample(logits.data(), int(logits.size()), ctx, scratch, idx);
  }
};

TEST(Sampler, GreedyTakesArgmax) {
  Fixture f;
  SamplingParams p;
  p.temperature = 0;
  EXPECT_EQ(f.run({0.1f, 3.0f, 2.9f, -1.0f}, p).token, 1);
}

// The engine samples rows on the device (argmax of the raw logits) exactly when samples_raw_argmax()
// says so; every parameter that edits the logits or needs them must turn it off, and when it is on,
// sample() must give the raw argmax.
TEST(Sampler, RawArgmaxPredicateMatchesSample) {
  Fixture f;
  f.counts = {{3, 2}};  // token 3 generated twice: penalties would move it
  const std::vector<float> logits = {0.5f, 1.0f, 0.9f, 1.2f, 1.2f};  // argmax 3 (tie with 4: lowest wins)
  auto raw_argmax = [&](const SamplingParams& p) {
    SampleContext ctx{&p, &f.prompt, &f.counts, f.num_output, &f.stops, 1, 0};
    return samples_raw_argmax(ctx);
  };
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_TRUE(raw_argmax(greedy));
  EXPECT_EQ(f.run(logits, greedy).token, 3);
  std::vector<SamplingParams> edits(7, greedy);
  edits[0].temperature = 0.7f;
  edits[1].logprobs = 0;
  edits[2].logit_bias = {{0, 5.0f}};
  edits[3].repetition_penalty = 1.5f;
  edits[4].presence_penalty = 1.0f;
  edits[5].frequency_penalty = 1.0f;
  edits[6].min_tokens = 5;  // stop ids are masked before min_tokens
  for (size_t i = 0; i < edits.size(); ++i) EXPECT_FALSE(raw_argmax(edits[i])) << "edit " << i;
  f.num_output = 5;  // min_tokens reached: nothing is masked any more
  EXPECT_TRUE(raw_argmax(edits[6]));
  EXPECT_EQ(f.run(logits, edits[6]).token, 3);
}

TEST(Sampler, LogitBiasAndMinTokens) {
  Fixture f;
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{3, 10.0f}};
  EXPECT_EQ(f.run({0.1f, 3.0f, 2.9f, -1.0f}, p).token, 3);
  SamplingParams q;
  q.temperature = 0;
  q.min_tokens = 2;
  EXPECT_EQ(f.run({5.0f, 3.0f, 2.9f, -1.0f}, q).token, 1);  // stop token 0 masked before min_tokens
  f.num_output = 2;
  EXPECT_EQ(f.run({5.0f, 3.0f, 2.9f, -1.0f}, q).token, 0);
}

TEST(Sampler, PenaltiesLowerRepeatedTokens) {
  Fixture f;
  f.counts = {{1, 3}};
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.1f;  // 3.0 - 0.3 = 2.7 < 2.9
  EXPECT_EQ(f.run({0.0f, 3.0f, 2.9f}, p).token, 2);
  SamplingParams q;
  q.temperature = 0;
  q.presence_penalty = 0.05f;  // 3.0 - 0.05 > 2.9
  EXPECT_EQ(f.run({0.0f, 3.0f, 2.9f}, q).token, 1);
  SamplingParams r;
  r.temperature = 0;
  r.repetition_penalty = 2.0f;  // token 1 (seen) 3.0 -> 1.5; token 2 (prompt) 2.9 -> 1.45; token 3 unseen
  EXPECT_EQ(f.run({0.0f, 3.0f, 2.9f, 1.6f}, r).token, 3);
}

TEST(Sampler, TopKOneIsGreedyAndTopPKeepsTheNucleus) {
  Fixture f;
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  for (uint64_t seed = 0; seed < 20; ++seed) EXPECT_EQ(f.run({0.0f, 1.0f, 0.5f}, p, seed).token, 1);
  SamplingParams q;
  q.top_p = 0.5f;  // probabilities ~0.84, 0.11, 0.04: the nucleus is token 0 alone
  for (uint64_t seed = 0; seed < 20; ++seed) EXPECT_EQ(f.run({2.0f, 0.0f, -1.0f}, q, seed).token, 0);
  SamplingParams m;
  m.min_p = 0.2f;  // token 2 (p ~0.05 < 0.2 * 0.84) never drawn
  for (uint64_t seed = 0; seed < 50; ++seed) EXPECT_NE(f.run({2.0f, 0.0f, -1.0f}, m, seed).token, 2);
}

TEST(Sampler, SeededDrawsAreReproducibleAndFollowTheDistribution) {
  Fixture f;
  SamplingParams p;
  std::map<int, int> hist;
  for (int step = 0; step < 2000; ++step) {
    f.num_output = step;
    const int a = f.run({0.0f, std::log(3.0f)}, p, 42).token;
    EXPECT_EQ(a, f.run({0.0f, std::log(3.0f)}, p, 42).token);
    hist[a]++;
  }
  EXPECT_NEAR(hist[1] / 2000.0, 0.75, 0.04);
  // Different sequences of one request draw differently.
  int differ = 0;
  for (int step = 0; step < 100; ++step) {
    f.num_output = step;
    differ += f.run({0.0f, 0.0f}, p, 7, 0).token != f.run({0.0f, 0.0f}, p, 7, 1).token;
  }
  EXPECT_GT(differ, 20);
}

TEST(Sampler, LogprobsComeFromTheRawDistribution) {
  Fixture f;
  SamplingParams p;
  p.temperature = 0;
  p.logprobs = 2;
  p.logit_bias = {{0, 100.0f}};
  SampleResult r = f.run({0.0f, std::log(3.0f)}, p);
  EXPECT_EQ(r.token, 0);
  EXPECT_NEAR(r.logprob.logprob, std::log(0.25), 1e-5);
  ASSERT_EQ(r.logprob.top.size(), 2u);
  EXPECT_EQ(r.logprob.top[0].first, 1);
  EXPECT_NEAR(r.logprob.top[0].second, std::log(0.75), 1e-5);
}

}  // namespace
}  // namespace beluga
