// HostSampleRows (the CPU backend's device sampler) against the two things it must agree with: the
// host sampler, sample(), given the same request (every filter, logit bias, penalties, a token mask,
// logprobs with top entries), and the independent reference of the device contract
// (reference_sample_rows.h: full sorts in double). Tokens and ranks must be equal, logprobs equal to
// float rounding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <unordered_map>

#include "engine/host_sample_rows.h"
#include "engine/sampler.h"
#include "reference_sample_rows.h"

namespace beluga::engine_test {
namespace {

struct Case {
  SamplingParams params;
  std::vector<int> prompt;
  std::unordered_map<int, int> counts;
  std::vector<uint32_t> mask;  // empty: none
  int num_output = 0;
};

constexpr int kVocab = 700;  // not a multiple of 32: the mask's last word is partial

// `top`: the row's likeliest tokens, generated (counted) in the penalized cases so the edits matter.
Case random_case(std::mt19937& rng, int i, const std::vector<int>& top) {
  Case c;
  SamplingParams& p = c.params;
  const float temps[] = {0.0f, 0.7f, 1.0f, 1.6f};
  p.temperature = temps[i % 4];
  p.top_k = (i / 4) % 3 == 0 ? 0 : (i / 4) % 3 == 1 ? 5 : 60;
  const float tops[] = {1.0f, 0.9f, 0.4f};
  p.top_p = tops[(i / 12) % 3];
  p.min_p = (i / 36) % 2 ? 0.05f : 0.0f;
  p.logprobs = i % 5 == 0 ? -1 : i % 5 == 1 ? 0 : 5;
  std::uniform_int_distribution<int> tok(0, kVocab - 1);
  const bool edits = p.logprobs < 0 || p.logprobs == 0;  // the device takes top logprobs without edits only
  if (edits && i % 3 == 0) {
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.2f;
    p.logit_bias = {{tok(rng), 3.0f}, {top[2], -2.5f}};
    for (size_t j = 0; j < top.size(); ++j) c.counts[top[j]] += 1 + int(j);
  }
  for (int j = 0; j < 40; ++j) c.prompt.push_back(tok(rng));
  for (int j = 0; j < 12; ++j) c.counts[tok(rng)] += 1 + j % 3;
  c.num_output = 12;
  if (i % 7 == 0) {  // about a third of the vocabulary allowed
    c.mask.assign((kVocab + 31) / 32, 0u);
    for (int t = 0; t < kVocab; ++t)
      if (tok(rng) % 3 == 0) c.mask[size_t(t >> 5)] |= 1u << (t & 31);
  }
  return c;
}

TEST(HostSampleRows, SameTokensAndLogprobsAsTheHostSamplerAndTheReference) {
  std::mt19937 rng(5);
  std::normal_distribution<float> logit(0.0f, 2.5f);
  const int R = 288;
  std::vector<float> logits(size_t(R) * kVocab);
  for (float& x : logits) x = logit(rng);
  for (int r = 0; r < R; r += 9) logits[size_t(r) * kVocab + 3] = logits[size_t(r) * kVocab + 4];  // ties
  std::vector<Case> cases;
  for (int r = 0; r < R; ++r) {
    const float* row = logits.data() + size_t(r) * kVocab;
    std::vector<int> top(static_cast<size_t>(kVocab));
    std::iota(top.begin(), top.end(), 0);
    std::partial_sort(top.begin(), top.begin() + 4, top.end(), [&](int a, int b) { return row[a] > row[b]; });
    top.resize(4);
    cases.push_back(random_case(rng, r, top));
  }

  // The device rows as the engine builds them (sampler.h: device_sample_row), masks in one tensor.
  const std::vector<int> no_stops;
  std::vector<DeviceSampleRow> rows;
  std::vector<DeviceLogitEdit> edits;
  std::vector<uint32_t> masks;
  for (int r = 0; r < R; ++r) {
    const Case& c = cases[size_t(r)];
    const SampleContext ctx{&c.params, &c.prompt, &c.counts, c.num_output, &no_stops, 1234, r};
    DeviceSampleRow row = device_sample_row(ctx, &edits);
    if (!c.mask.empty()) {
      row.mask_row = int(masks.size() / c.mask.size());
      masks.insert(masks.end(), c.mask.begin(), c.mask.end());
    }
    rows.push_back(row);
  }
  auto run = [&](SampleRowsOp& op) {
    std::vector<float> lg(logits);  // the op may edit its input rows
    std::vector<int32_t> out(size_t(R) * kSampleOutCols, -7);
    std::vector<float> raw(edits.size() + 1), lse(static_cast<size_t>(R));
    const SampleEdits se{Tensor::make(edits.data(), DType::kI32, {int64_t(edits.size()), 4}),
                         Tensor::make(raw.data(), DType::kF32, {int64_t(raw.size())}),
                         Tensor::make(lse.data(), DType::kF32, {R})};
    op.sample_rows(Tensor::make(out.data(), DType::kI32, {R, kSampleOutCols}),
                   Tensor::make(lg.data(), DType::kF32, {R, kVocab}),
                   Tensor::make(rows.data(), DType::kI32, {R, kSampleRowWords}),
                   Tensor::make(masks.data(), DType::kI32,
                                {int64_t(masks.size() / ((kVocab + 31) / 32)), (kVocab + 31) / 32}),
                   se);
    return out;
  };
  HostSampleRows host_op;
  ReferenceSampleRows reference;
  const std::vector<int32_t> got = run(host_op), ref = run(reference);
  // Twice: its reused buffers carry nothing from one call to the next.
  EXPECT_EQ(run(host_op), got);

  std::vector<float> scratch;
  std::vector<int> idx;
  int sampled = 0, masked = 0, edited = 0, tops = 0;
  for (int r = 0; r < R; ++r) {
    const Case& c = cases[size_t(r)];
    const int32_t* g = got.data() + size_t(r) * kSampleOutCols;
    const int32_t* f = ref.data() + size_t(r) * kSampleOutCols;
    EXPECT_EQ(g[0], f[0]) << "row " << r << ": not the reference's token";
    // sample() on the same row, its allowed mask the row's
    std::vector<float> x(logits.begin() + int64_t(r) * kVocab, logits.begin() + int64_t(r + 1) * kVocab);
    SampleContext ctx{&c.params, &c.prompt, &c.counts, c.num_output, &no_stops, 1234, r};
    if (!c.mask.empty()) ctx.allowed = c.mask.data();
    const SampleResult h = sample(x.data(), kVocab, ctx, scratch, idx);
    ASSERT_EQ(g[0], h.token) << "row " << r << ": not the host sampler's token";
    sampled += c.params.temperature > 0;
    masked += !c.mask.empty();
    edited += rows[size_t(r)].edit_count > 0;
    if (c.params.logprobs < 0) continue;
    float lp, rlp;
    std::memcpy(&lp, &g[1], 4);
    std::memcpy(&rlp, &f[1], 4);
    EXPECT_NEAR(lp, h.logprob.logprob, 1e-6) << "row " << r;
    EXPECT_NEAR(lp, rlp, 1e-4) << "row " << r;
    EXPECT_EQ(g[2], h.logprob.rank) << "row " << r;
    ASSERT_EQ(g[3], int(h.logprob.top.size())) << "row " << r;
    tops += g[3] > 0;
    for (int j = 0; j < g[3]; ++j) {
      float v;
      std::memcpy(&v, &g[5 + 2 * j], 4);
      EXPECT_EQ(g[4 + 2 * j], h.logprob.top[size_t(j)].first) << "row " << r << " top " << j;
      EXPECT_FLOAT_EQ(v, h.logprob.top[size_t(j)].second) << "row " << r << " top " << j;
    }
  }
  // The cases cover what they claim to.
  EXPECT_GT(sampled, R / 2);
  EXPECT_GT(masked, 20);
  EXPECT_GT(edited, 20);
  EXPECT_GT(tops, 20);
}

}  // namespace
}  // namespace beluga::engine_test
