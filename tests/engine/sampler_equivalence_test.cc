// The sampler's partial selection (top_k / top_p / min_p) and incremental penalties against the
// straightforward algorithm they replace (a full sort of the vocabulary, the prompt sorted per step),
// kept here as the reference: for the same seed both must give the same token, for random logits
// over many parameter sets, and the draws must follow the filtered distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>

#include "engine/sampler.h"

namespace beluga {
namespace {

// The sampler as it was before partial selection (same parameter order and one uniform per step).
int reference_sample(std::vector<float> l, const SampleContext& ctx) {
  const SamplingParams& p = *ctx.params;
  const int vocab = int(l.size());
  float* logits = l.data();
  for (const auto& [tok, bias] : p.logit_bias)
    if (tok >= 0 && tok < vocab) logits[tok] += bias;
  if (p.repetition_penalty != 1.0f) {
    std::vector<int> seen(*ctx.prompt);
    for (const auto& [t, c] : *ctx.output_counts) seen.push_back(t);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int t : seen)
      logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty : logits[t] * p.repetition_penalty;
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (const auto& [t, c] : *ctx.output_counts)
      logits[t] -= p.presence_penalty + p.frequency_penalty * float(c);
  if (ctx.num_output < p.min_tokens)
    for (int t : *ctx.stop_ids) logits[t] = -INFINITY;
  if (p.temperature <= 0.0f) return int(std::max_element(logits, logits + vocab) - logits);
  std::vector<int> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const int k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
  auto by_logit = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  if (k < vocab)
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
  else if (p.top_p < 1.0f || p.min_p > 0.0f)
    std::sort(idx.begin(), idx.end(), by_logit);
  float mx = -INFINITY;
  for (int i = 0; i < k; ++i) mx = std::max(mx, logits[idx[size_t(i)]]);
  std::vector<double> prob(static_cast<size_t>(k));
  double sum = 0;
  for (int i = 0; i < k; ++i)
    sum += (prob[size_t(i)] = std::exp(double(logits[idx[size_t(i)]] - mx) / p.temperature));
  int keep = k;
  if (p.top_p < 1.0f) {
    double acc = 0;
    for (int i = 0; i < k; ++i) {
      acc += prob[size_t(i)] / sum;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    const double floor = p.min_p * prob[0];
    int i = 1;
    while (i < keep && prob[size_t(i)] >= floor) ++i;
    keep = i;
  }
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += prob[size_t(i)];
  const double u = sample_uniform(ctx.seed, ctx.seq_index, ctx.num_output) * kept;
  double acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += prob[size_t(i)];
    if (u < acc) return idx[size_t(i)];
  }
  return idx[size_t(keep - 1)];
}

// Logits shaped like a model's: a few strong candidates over a long tail, with exact ties.
std::vector<float> model_like_logits(std::mt19937_64& rng, int vocab, float spread) {
  std::normal_distribution<float> n(0.0f, spread);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& x : l) x = n(rng);
  for (int i = 0; i < 8; ++i) l[rng() % size_t(vocab)] += 6.0f + float(i);
  for (int i = 0; i < 16; ++i) l[rng() % size_t(vocab)] = l[rng() % size_t(vocab)];  // ties
  return l;
}

struct FilterCase {
  float temperature, top_p;
  int top_k;
  float min_p, rep, presence, frequency;
};

// Every filter alone and combined, with and without penalties: the same token as the full sort for
// each of many seeds and steps.
TEST(SamplerEquivalence, SameTokensAsFullSortForEverySeed) {
  const std::vector<FilterCase> cases = {
      {1.0f, 1.0f, 0, 0.0f, 1.0f, 0.0f, 0.0f},   {0.7f, 0.9f, 0, 0.0f, 1.0f, 0.0f, 0.0f},
      {1.3f, 0.5f, 0, 0.0f, 1.0f, 0.0f, 0.0f},   {1.0f, 0.999f, 0, 0.0f, 1.0f, 0.0f, 0.0f},
      {1.0f, 1.0f, 40, 0.0f, 1.0f, 0.0f, 0.0f},  {0.8f, 0.95f, 50, 0.0f, 1.0f, 0.0f, 0.0f},
      {1.0f, 1.0f, 0, 0.05f, 1.0f, 0.0f, 0.0f},  {1.0f, 0.9f, 0, 0.1f, 1.0f, 0.0f, 0.0f},
      {1.0f, 0.9f, 20, 0.02f, 1.0f, 0.0f, 0.0f}, {0.9f, 0.8f, 0, 0.0f, 1.3f, 0.5f, 0.2f},
      {1.0f, 1.0f, 1, 0.0f, 1.0f, 0.0f, 0.0f},   {5.0f, 0.3f, 0, 0.0f, 0.8f, -0.4f, 0.0f},
      {0.0f, 1.0f, 0, 0.0f, 1.2f, 0.3f, 0.1f},
  };
  std::mt19937_64 rng(2026);
  std::vector<float> scratch;
  std::vector<int> idx;
  for (int vocab : {257, 8192}) {
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const FilterCase& c = cases[ci];
      SamplingParams p;
      p.temperature = c.temperature;
      p.top_p = c.top_p;
      p.top_k = c.top_k;
      p.min_p = c.min_p;
      p.repetition_penalty = c.rep;
      p.presence_penalty = c.presence;
      p.frequency_penalty = c.frequency;
      p.min_tokens = 3;
      p.logit_bias = {{5, 2.0f}, {vocab - 1, -1.0f}};
      std::vector<int> prompt(300);
      for (auto& t : prompt) t = int(rng() % uint64_t(vocab));
      const std::vector<int> prompt_set = distinct_tokens(prompt);
      std::unordered_map<int, int> counts;
      const std::vector<int> stops = {0, 2};
      for (int step = 0; step < 60; ++step) {
        const std::vector<float> logits = model_like_logits(rng, vocab, step % 2 ? 1.0f : 3.0f);
        for (uint64_t seed : {1ull, 77ull, 123456789ull}) {
          SampleContext ctx{&p, &prompt, &counts, step, &stops, seed, int(step % 3)};
          const int want = reference_sample(logits, ctx);
          std::vector<float> a(logits);
          EXPECT_EQ(sample(a.data(), vocab, ctx, scratch, idx).token, want)
              << "vocab " << vocab << " case " << ci << " step " << step << " seed " << seed;
          ctx.prompt_set = &prompt_set;  // the engine's path: distinct prompt tokens kept per request
          std::vector<float> b(logits);
          EXPECT_EQ(sample(b.data(), vocab, ctx, scratch, idx).token, want)
              << "prompt_set: vocab " << vocab << " case " << ci << " step " << step << " seed " << seed;
        }
        counts[int(rng() % uint64_t(vocab))]++;  // the sequence's output grows
        counts[prompt[size_t(step)]]++;          // including tokens of the prompt
      }
    }
  }
}

// The dedup bitmask is cleared after each call: a token penalized for one sequence's prompt is not
// treated as seen for the next call with another prompt (a leak would apply the penalty twice or
// skip it).
TEST(SamplerEquivalence, RepetitionPenaltyStateDoesNotLeakBetweenCalls) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 4.0f;
  std::unordered_map<int, int> none;
  const std::vector<int> stops;
  std::vector<float> scratch;
  std::vector<int> idx;
  const std::vector<int> first = {1, 1, 1}, second = {2};
  for (int round = 0; round < 3; ++round) {
    std::vector<float> l = {0.0f, 3.0f, 2.0f, 1.0f};
    SampleContext a{&p, &first, &none, 0, &stops, 1, 0};
    EXPECT_EQ(sample(l.data(), 4, a, scratch, idx).token, 2);  // 3 / 4 < 2
    EXPECT_FLOAT_EQ(l[1], 0.75f);                              // divided once, not three times
    std::vector<float> m = {0.0f, 3.0f, 2.0f, 1.0f};
    SampleContext b{&p, &second, &none, 0, &stops, 1, 0};
    EXPECT_EQ(sample(m.data(), 4, b, scratch, idx).token, 1);  // token 1 is not seen here
    EXPECT_FLOAT_EQ(m[2], 0.5f);
  }
}

// Seeded draws follow the filtered distribution: top_p over a known distribution keeps exactly the
// nucleus, renormalized (chi-square over 20000 steps against the expected counts).
TEST(SamplerEquivalence, TopPDrawsFollowTheRenormalizedNucleus) {
  const int vocab = 4096;
  std::vector<float> logits(size_t(vocab), -30.0f);  // a tail that never reaches the nucleus
  const std::vector<double> head = {0.4, 0.25, 0.15, 0.1, 0.05, 0.05};
  for (size_t i = 0; i < head.size(); ++i) logits[size_t(100 + 37 * i)] = float(std::log(head[i]));
  SamplingParams p;
  p.top_p = 0.85f;  // 0.4 + 0.25 + 0.15 = 0.8 < 0.85 <= 0.9: the first four
  const std::unordered_map<int, int> none;
  const std::vector<int> prompt, stops;
  std::vector<float> scratch;
  std::vector<int> idx;
  std::map<int, int> hist;
  const int N = 20000;
  for (int step = 0; step < N; ++step) {
    std::vector<float> l(logits);
    SampleContext ctx{&p, &prompt, &none, step, &stops, 9, 0};
    hist[sample(l.data(), vocab, ctx, scratch, idx).token]++;
  }
  ASSERT_EQ(hist.size(), 4u);
  double chi2 = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double expected = N * head[i] / 0.9;
    const double got = hist[int(100 + 37 * i)];
    chi2 += (got - expected) * (got - expected) / expected;
  }
  EXPECT_LT(chi2, 16.27);  // p = 0.001 for 3 degrees of freedom
}

}  // namespace
}  // namespace beluga
