// The device sampler (CudaSampleRows, backend/sample_rows.h) against the CPU sampler
// (engine/sampler.h), both given the same rows, masks and uniforms:
//   greedy (with and without masks, logits full of ties): token ids equal on every row;
//   top_k = 1 at temperature 1: the masked argmax on every row;
//   sampled rows (temperature alone, top_k, top_p, min_p, their mixes, with masks): the same token as
//     the host for >= 99.5 % of the draws (the same uniform walks the same order; only rounding at a
//     boundary may differ), never a token the mask or a filter excludes, and over 65536 draws of
//     one 4096-token row the empirical distribution within 1.5x the sampling noise's expected total
//     variation (Poisson mean absolute deviations) of the filtered distribution computed in double;
//   logprob and rank of the token: within 1e-4 and equal to token_logprob's, and the top 5 / 20 (ids
//     in the host's order, values within 1e-4);
//   logit bias and penalties (logit edits): the host's tokens, logprobs and ranks.
// Fixed seeds throughout. Not part of ctest: tests/gpu/run.sh runs it (--gtest_filter=SampleRows.*).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample_rows.h"
#include "engine/sampler.h"

namespace beluga {
namespace {

class SampleRows : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    ops = std::make_unique<CudaOps>();
    sampler = std::make_unique<CudaSampleRows>(*ops);
  }

  // Rows of logits with many exact ties (multiples of 1/16 of a normal(0, scale) draw).
  static std::vector<float> tied_logits(int R, int V, float scale, uint64_t seed) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(size_t(R) * size_t(V));
    for (auto& x : v) x = std::round(d(g) * 16.0f) / 16.0f;
    return v;
  }
  // A mask allowing about `keep` of the ids at random, and always id `always`.
  static std::vector<uint32_t> random_mask(int V, double keep, int always, std::mt19937_64& g) {
    std::vector<uint32_t> m((size_t(V) + 31) / 32, 0);
    std::bernoulli_distribution b(keep);
    for (int t = 0; t < V; ++t)
      if (b(g) || t == always) m[size_t(t) >> 5] |= 1u << (t & 31);
    return m;
  }

  // The device's [R, 4] output for these rows.
  std::vector<int32_t> device(const std::vector<float>& logits, int R, int V,
                              const std::vector<DeviceSampleRow>& rows, const std::vector<uint32_t>& masks) {
    const int64_t words = (V + 31) / 32;
    Tensor lg = ops->alloc_persistent(DType::kF32, {R, V});
    ops->copy_from_host(lg, logits.data());
    Tensor rw = ops->alloc_persistent(DType::kI32, {R, kSampleRowWords});
    ops->copy_from_host(rw, rows.data());
    Tensor mk;
    if (!masks.empty()) {
      mk = ops->alloc_persistent(DType::kI32, {int64_t(masks.size()) / words, words});
      ops->copy_from_host(mk, masks.data());
    }
    Tensor out = ops->alloc_persistent(DType::kI32, {R, kSampleOutCols});
    sampler->sample_rows(out, lg, rw, mk);
    std::vector<int32_t> h(size_t(R) * kSampleOutCols);
    ops->copy_to_host(out, h.data());
    return h;
  }

  // Host and device tokens for R rows of `logits` under params[r % params.size()], row r's mask
  // (masks[r % masks.size()], none when empty) and seed r; the host's in *host.
  std::vector<int32_t> both(const std::vector<float>& logits, int R, int V,
                            const std::vector<SamplingParams>& params,
                            const std::vector<std::vector<uint32_t>>& masks, std::vector<int>* host,
                            std::vector<TokenLogprob>* host_lp = nullptr) {
    std::vector<DeviceSampleRow> rows;
    std::vector<uint32_t> flat;
    const std::vector<int> prompt, stop;
    const std::unordered_map<int, int> counts;
    std::vector<float> scratch, work;
    std::vector<int> idx;
    host->clear();
    for (int r = 0; r < R; ++r) {
      const SamplingParams& p = params[size_t(r) % params.size()];
      SampleContext ctx{&p, &prompt, &counts, r % 7, &stop, uint64_t(1000 + r), r};
      EXPECT_TRUE(samples_on_device(ctx));
      DeviceSampleRow row = device_sample_row(ctx);
      if (!masks.empty()) {
        const auto& m = masks[size_t(r) % masks.size()];
        row.mask_row = int(flat.size() / m.size());
        flat.insert(flat.end(), m.begin(), m.end());
        ctx.allowed = m.data();
      }
      rows.push_back(row);
      work.assign(logits.begin() + int64_t(r) * V, logits.begin() + int64_t(r + 1) * V);
      const SampleResult res = sample(work.data(), V, ctx, scratch, idx);
      host->push_back(res.token);
      if (host_lp) host_lp->push_back(res.logprob);
    }
    return device(logits, R, V, rows, flat);
  }

  std::unique_ptr<CudaOps> ops;
  std::unique_ptr<CudaSampleRows> sampler;
};

bool allowed(const std::vector<uint32_t>& m, int t) {
  return (m[size_t(t) >> 5] >> (t & 31)) & 1u;
}

TEST_F(SampleRows, GreedyIsBitIdenticalToTheHost) {
  constexpr int R = 64, V = 129280;
  const std::vector<float> logits = tied_logits(R, V, 2.0f, 1);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<int> host;
  std::vector<int32_t> out = both(logits, R, V, {greedy}, {}, &host);
  for (int r = 0; r < R; ++r) EXPECT_EQ(out[size_t(r) * kSampleOutCols], host[size_t(r)]) << "row " << r;
  // Masked: a sparse and a dense mask.
  std::mt19937_64 g(2);
  const std::vector<std::vector<uint32_t>> masks = {random_mask(V, 0.001, 77, g), random_mask(V, 0.6, 5, g)};
  out = both(logits, R, V, {greedy}, masks, &host);
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(out[size_t(r) * kSampleOutCols], host[size_t(r)]) << "masked row " << r;
    EXPECT_TRUE(allowed(masks[size_t(r) % 2], host[size_t(r)]));
  }
}

TEST_F(SampleRows, TopKOneIsTheMaskedArgmax) {
  constexpr int R = 32, V = 50000;
  const std::vector<float> logits = tied_logits(R, V, 1.0f, 3);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 1;
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::mt19937_64 g(4);
  const std::vector<std::vector<uint32_t>> masks = {random_mask(V, 0.3, 9, g)};
  std::vector<int> host, argmax;
  const std::vector<int32_t> out = both(logits, R, V, {p}, masks, &host);
  both(logits, R, V, {greedy}, masks, &argmax);
  for (int r = 0; r < R; ++r) {
    EXPECT_EQ(out[size_t(r) * kSampleOutCols], argmax[size_t(r)]) << "row " << r;
    EXPECT_EQ(host[size_t(r)], argmax[size_t(r)]) << "row " << r;
  }
}

// The same uniforms walk the same order: the device's tokens are the host's but for rounding.
TEST_F(SampleRows, SampledRowsMatchTheHostDrawForDraw) {
  constexpr int R = 512, V = 129280;
  const std::vector<float> logits = tied_logits(R, V, 3.0f, 5);
  std::vector<SamplingParams> params(7);
  params[0].temperature = 0.8f;  // no filter: id order
  params[1].temperature = 1.0f, params[1].top_k = 50;
  params[2].temperature = 0.7f, params[2].top_p = 0.9f;
  params[3].temperature = 1.2f, params[3].min_p = 0.05f;
  params[4].temperature = 0.6f, params[4].top_k = 2000, params[4].top_p = 0.95f;
  params[5].temperature = 1.0f, params[5].top_k = 40, params[5].top_p = 0.8f, params[5].min_p = 0.02f;
  params[6].temperature = 0.5f, params[6].top_p = 0.5f, params[6].min_p = 0.1f;
  for (const bool masked : {false, true}) {
    std::mt19937_64 g(6);
    std::vector<std::vector<uint32_t>> masks;
    if (masked) masks = {random_mask(V, 0.5, 0, g), random_mask(V, 0.01, 1, g), random_mask(V, 0.9, 2, g)};
    std::vector<int> host;
    const std::vector<int32_t> out = both(logits, R, V, params, masks, &host);
    int same = 0;
    for (int r = 0; r < R; ++r) {
      const int t = out[size_t(r) * kSampleOutCols];
      ASSERT_GE(t, 0);
      ASSERT_LT(t, V);
      same += t == host[size_t(r)];
      if (masked) {
        EXPECT_TRUE(allowed(masks[size_t(r) % masks.size()], t)) << "row " << r;
      }
      const SamplingParams& p = params[size_t(r) % params.size()];
      if (p.top_k > 0) {  // at most top_k - 1 allowed tokens rank above it
        const float* x = logits.data() + int64_t(r) * V;
        int above = 0;
        for (int i = 0; i < V; ++i)
          above += (!masked || allowed(masks[size_t(r) % masks.size()], i)) &&
                   (x[i] > x[t] || (x[i] == x[t] && i < t));
        EXPECT_LT(above, p.top_k) << "row " << r;
      }
    }
    std::printf("[figures] sample_rows %s: %d of %d draws equal to the host's\n",
                masked ? "masked" : "unmasked", same, R);
    EXPECT_GE(same, int(0.995 * R));
  }
}

// The filtered distribution in double, as engine/sampler.h defines it (descending order, ties by id).
std::vector<double> filtered_distribution(const std::vector<float>& x, const SamplingParams& p) {
  const int V = int(x.size());
  std::vector<int> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  std::sort(idx.begin(), idx.end(), [&](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  const int k = p.top_k > 0 && p.top_k < V ? p.top_k : V;
  std::vector<double> prob(size_t(V), 0.0);
  double sum = 0;
  for (int i = 0; i < k; ++i)
    sum += prob[size_t(idx[size_t(i)])] = std::exp(double(x[idx[size_t(i)]] - x[idx[0]]) / p.temperature);
  int keep = k;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    const double q = prob[size_t(idx[size_t(i)])];
    if (i > 0 && p.min_p > 0 && q < p.min_p) {
      keep = i;
      break;
    }
    acc += q / sum;
    if (p.top_p < 1 && acc >= p.top_p) {
      keep = i + 1;
      break;
    }
  }
  std::vector<double> out(size_t(V), 0.0);
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += prob[size_t(idx[size_t(i)])];
  for (int i = 0; i < keep; ++i) out[size_t(idx[size_t(i)])] = prob[size_t(idx[size_t(i)])] / kept;
  return out;
}

TEST_F(SampleRows, DistributionWithinTotalVariationBound) {
  constexpr int V = 4096, R = 65536;
  std::vector<float> row = tied_logits(1, V, 2.0f, 7);
  std::vector<float> logits;
  logits.reserve(size_t(R) * V);
  for (int r = 0; r < R; ++r) logits.insert(logits.end(), row.begin(), row.end());
  std::vector<SamplingParams> cases(3);
  cases[0].temperature = 1.0f, cases[0].top_p = 0.9f;
  cases[1].temperature = 0.7f, cases[1].top_k = 100, cases[1].min_p = 0.01f;
  cases[2].temperature = 1.5f;
  for (const SamplingParams& p : cases) {
    std::vector<int> host;
    const std::vector<int32_t> out = both(logits, R, V, {p}, {}, &host);
    const std::vector<double> want = filtered_distribution(row, p);
    std::vector<double> got(size_t(V), 0.0), got_host(size_t(V), 0.0);
    for (int r = 0; r < R; ++r) {
      got[size_t(out[size_t(r) * kSampleOutCols])] += 1.0 / R;
      got_host[size_t(host[size_t(r)])] += 1.0 / R;
    }
    double tv = 0, tv_host = 0;
    int excluded = 0;
    for (int t = 0; t < V; ++t) {
      tv += 0.5 * std::abs(got[size_t(t)] - want[size_t(t)]);
      tv_host += 0.5 * std::abs(got_host[size_t(t)] - want[size_t(t)]);
      excluded += want[size_t(t)] == 0 && got[size_t(t)] > 0;
    }
    // The sampling noise alone: E[TV] = 0.5 / R * sum_t E|X_t - R p_t| with X_t ~ Poisson(R p_t), whose
    // mean absolute deviation is 2 e^-l l^(m+1) / m! (m = floor(l); above the binomial's). A wrong
    // filter or walk moves the device far past it and puts mass where `want` has none (checked exactly).
    double expected = 0;
    for (double q : want) {
      if (q <= 0) continue;
      const double l = R * q, m = std::floor(l);
      expected += 2.0 * std::exp(-l + (m + 1) * std::log(l) - std::lgamma(m + 1));
    }
    expected *= 0.5 / R;
    std::printf(
        "[figures] sample_rows T=%.1f top_k=%d top_p=%.2f min_p=%.2f: TV device %.4f, host %.4f, noise "
        "%.4f\n",
        p.temperature, p.top_k, p.top_p, p.min_p, tv, tv_host, expected);
    EXPECT_LE(tv, 1.5 * expected);
    EXPECT_EQ(excluded, 0);
  }
}

TEST_F(SampleRows, LogprobAndRankMatchTheHost) {
  constexpr int R = 48, V = 129280;
  const std::vector<float> logits = tied_logits(R, V, 2.0f, 8);
  SamplingParams greedy, sampled;
  greedy.temperature = 0.0f;
  greedy.logprobs = 20;  // and the top 20 / 5
  sampled.temperature = 0.9f;
  sampled.top_p = 0.95f;
  sampled.logprobs = 5;
  std::vector<int> host;
  std::vector<TokenLogprob> lps;
  const std::vector<int32_t> out = both(logits, R, V, {greedy, sampled}, {}, &host, &lps);
  for (int r = 0; r < R; ++r) {
    const int32_t* o = out.data() + size_t(r) * kSampleOutCols;
    if (o[0] != host[size_t(r)]) continue;  // a rounding-boundary draw: compared in the test above
    float lp;
    std::memcpy(&lp, &o[1], 4);
    EXPECT_NEAR(lp, lps[size_t(r)].logprob, 1e-4) << "row " << r;
    EXPECT_EQ(o[2], lps[size_t(r)].rank) << "row " << r;
    const auto& top = lps[size_t(r)].top;
    ASSERT_EQ(o[3], int(top.size())) << "row " << r;
    for (size_t j = 0; j < top.size(); ++j) {
      float v;
      std::memcpy(&v, &o[5 + 2 * j], 4);
      EXPECT_EQ(o[4 + 2 * j], top[j].first) << "row " << r << " top " << j;
      EXPECT_NEAR(v, top[j].second, 1e-4) << "row " << r << " top " << j;
    }
  }
}

// Logit bias and repetition / presence / frequency penalties as logit edits (device_sample_row's,
// applied by the device in the host sampler's float arithmetic) against the host sampler given the
// same prompt, output counts and bias: greedy rows the same token, sampled rows the same token for
// >= 99 % of the rows, and the token's logprob and rank in the raw distribution where both agree.
TEST_F(SampleRows, LogitEditsMatchTheHost) {
  constexpr int R = 64, V = 129280;
  const std::vector<float> logits = tied_logits(R, V, 2.0f, 11);
  std::vector<SamplingParams> params(4);
  params[0].temperature = 0.0f, params[0].repetition_penalty = 1.3f, params[0].frequency_penalty = 0.5f;
  params[1].temperature = 0.9f, params[1].top_p = 0.95f, params[1].presence_penalty = 0.8f,
  params[1].frequency_penalty = 0.3f;
  params[2].temperature = 1.0f, params[2].top_k = 40, params[2].repetition_penalty = 1.5f;
  params[3].temperature = 0.0f, params[3].repetition_penalty = 0.7f, params[3].presence_penalty = -1.0f;
  for (auto& p : params) p.logprobs = 0;
  std::mt19937_64 g(5);
  std::vector<DeviceSampleRow> rows;
  std::vector<DeviceLogitEdit> edits;
  std::vector<int> host;
  std::vector<TokenLogprob> host_lp;
  std::vector<float> scratch, work;
  std::vector<int> idx;
  const std::vector<int> stop;
  std::vector<SamplingParams> row_params;
  for (int r = 0; r < R; ++r) {
    SamplingParams p = params[size_t(r) % params.size()];
    const float* x = logits.data() + int64_t(r) * V;
    const int top = int(std::max_element(x, x + V) - x);
    // The bias reaches the top tokens: the row's argmax pushed down, others up.
    p.logit_bias = {{top, -4.0f}, {int(g() % V), 6.0f}, {int(g() % V), 2.5f}, {V + 3, 9.0f}};
    std::vector<int> prompt;
    for (int i = 0; i < 300; ++i) prompt.push_back(i % 5 == 0 ? top : int(g() % V));
    std::unordered_map<int, int> counts;
    for (int i = 0; i < 60; ++i) counts[i % 4 == 0 ? prompt[size_t(i)] : int(g() % V)] += 1 + int(g() % 3);
    counts[top] += 1;
    const std::vector<int> pset = distinct_tokens(prompt);
    SampleContext ctx{&p, &prompt, &counts, 5 + r, &stop, uint64_t(77 + r), r};
    ctx.prompt_set = &pset;
    ASSERT_TRUE(samples_on_device(ctx));
    rows.push_back(device_sample_row(ctx, &edits));
    work.assign(x, x + V);
    const SampleResult res = sample(work.data(), V, ctx, scratch, idx);
    host.push_back(res.token);
    host_lp.push_back(res.logprob);
    row_params.push_back(p);
  }
  Tensor lg = ops->alloc_persistent(DType::kF32, {R, V});
  ops->copy_from_host(lg, logits.data());
  Tensor rw = ops->alloc_persistent(DType::kI32, {R, kSampleRowWords});
  ops->copy_from_host(rw, rows.data());
  const int64_t E = int64_t(edits.size());
  SampleEdits se{ops->alloc_persistent(DType::kI32, {E, 4}), ops->alloc_persistent(DType::kF32, {E}),
                 ops->alloc_persistent(DType::kF32, {R})};
  ops->copy_from_host(se.edits, edits.data());
  Tensor out = ops->alloc_persistent(DType::kI32, {R, kSampleOutCols});
  sampler->sample_rows(out, lg, rw, Tensor{}, se);
  std::vector<int32_t> o(size_t(R) * kSampleOutCols);
  ops->copy_to_host(out, o.data());
  int same = 0, sampled = 0;
  for (int r = 0; r < R; ++r) {
    const int32_t* row = o.data() + size_t(r) * kSampleOutCols;
    const bool greedy = row_params[size_t(r)].temperature <= 0.0f;
    if (greedy) {
      EXPECT_EQ(row[0], host[size_t(r)]) << "greedy row " << r;
    } else {
      ++sampled;
      same += row[0] == host[size_t(r)];
    }
    if (row[0] != host[size_t(r)]) continue;
    float lp;
    std::memcpy(&lp, &row[1], 4);
    EXPECT_NEAR(lp, host_lp[size_t(r)].logprob, 1e-4) << "row " << r;
    EXPECT_EQ(row[2], host_lp[size_t(r)].rank) << "row " << r;
  }
  EXPECT_GE(same * 100, sampled * 99) << same << " of " << sampled << " sampled rows";
  std::printf("logit edits: %lld entries over %d rows; %d of %d sampled rows the host's token\n",
              (long long)E, R, same, sampled);
}

// Not a bound: the kernel's time per launch at decode batches (V2-Lite and V3 vocabularies), printed
// as "[figures]" lines for docs/performance.md.
TEST_F(SampleRows, Timing) {
  for (const int V : {102400, 129280})
    for (const int R : {1, 16, 64}) {
      const std::vector<float> logits = tied_logits(R, V, 3.0f, 9);
      Tensor lg = ops->alloc_persistent(DType::kF32, {R, V});
      ops->copy_from_host(lg, logits.data());
      Tensor rw = ops->alloc_persistent(DType::kI32, {R, kSampleRowWords});
      Tensor out = ops->alloc_persistent(DType::kI32, {R, kSampleOutCols});
      for (const char* mode : {"greedy", "T0.8", "T0.8 top_p0.95", "T0.8 top_k50 top_p0.95"}) {
        std::vector<DeviceSampleRow> rows(static_cast<size_t>(R));
        for (int r = 0; r < R; ++r) {
          DeviceSampleRow& d = rows[size_t(r)];
          d.u = (r + 0.5) / R;
          if (std::string(mode) != "greedy") d.temperature = 0.8f;
          if (std::strstr(mode, "top_p")) d.top_p = 0.95f;
          if (std::strstr(mode, "top_k")) d.top_k = 50;
        }
        ops->copy_from_host(rw, rows.data());
        constexpr int kReps = 20;
        sampler->sample_rows(out, lg, rw, Tensor{});
        ops->synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kReps; ++i) sampler->sample_rows(out, lg, rw, Tensor{});
        ops->synchronize();
        const double us =
            std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kReps;
        std::printf("[figures] sample_rows V=%d R=%d %s: %.1f us\n", V, R, mode, us);
      }
    }
}

}  // namespace
}  // namespace beluga
