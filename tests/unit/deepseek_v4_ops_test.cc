// DeepSeek-V4's CPU ops on small hand-checked cases: hyper-connection weights (Sinkhorn), stream
// collapse/expand, the compressor's gated pooling (plain and overlapping windows), the indexer's
// causal top-k with ties, shared-KV attention with sinks, hash and sqrtsoftplus routing, and the
// experts' swiglu clamp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace beluga {
namespace {

Tensor f32(std::vector<float>& v, std::initializer_list<int64_t> shape) {
  return Tensor::make(v.data(), DType::kF32, shape);
}
Tensor i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return Tensor::make(v.data(), DType::kI32, shape);
}
Weight weight(Tensor w) {
  Weight r;
  r.w = w;
  return r;
}
double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// n = 2 streams: mix [1, 8] = [pre(2) | post(2) | comb(4)].
TEST(V4HyperConnection, WeightsWithOneSinkhornStepAreColumnNormalizedSoftmax) {
  CpuOps ops({1});
  std::vector<float> mix = {1, -1, 0.5f, 0, 0, 0, 0, 0};
  // comb logits base: log([[1, 3], [1, 1]]) -> row softmax [[.25, .75], [.5, .5]].
  std::vector<float> base = {0, 0.5f, 0, 0, 0, std::log(3.0f), 0, 0};
  std::vector<float> scale = {2, 3, 1};
  std::vector<float> pre(2), post(2), comb(4);
  ops.hc_weights(f32(pre, {1, 2}), f32(post, {1, 2}), f32(comb, {1, 4}), f32(mix, {1, 8}), f32(base, {8}),
                 f32(scale, {3}), 1, 0.0f);
  EXPECT_NEAR(pre[0], sigmoid(2.0), 1e-6);
  EXPECT_NEAR(pre[1], sigmoid(-2.0 + 0.5), 1e-6);
  EXPECT_NEAR(post[0], 2 * sigmoid(1.5), 1e-6);
  EXPECT_NEAR(post[1], 2 * sigmoid(0.0), 1e-6);
  // Columns normalized once: col 0 sums .75, col 1 sums 1.25.
  EXPECT_NEAR(comb[0], 1.0 / 3, 1e-6);
  EXPECT_NEAR(comb[1], 0.6, 1e-6);
  EXPECT_NEAR(comb[2], 2.0 / 3, 1e-6);
  EXPECT_NEAR(comb[3], 0.4, 1e-6);
}

TEST(V4HyperConnection, SinkhornConvergesToTheDoublyStochasticScaling) {
  CpuOps ops({1});
  std::vector<float> mix(8, 0.0f), base = {0, 0, 0, 0, 0, std::log(3.0f), 0, 0}, scale = {1, 1, 1};
  std::vector<float> pre(2), post(2), comb(4);
  ops.hc_weights(f32(pre, {1, 2}), f32(post, {1, 2}), f32(comb, {1, 4}), f32(mix, {1, 8}), f32(base, {8}),
                 f32(scale, {3}), 20, 1e-6f);
  // The doubly stochastic D1 A D2 of A = [[1, 3], [1, 1]] is [[a, 1-a], [1-a, a]] with the cross ratio
  // a^2 / (1-a)^2 = 1/3 kept: a = 1 / (1 + sqrt 3).
  const double a = 1.0 / (1.0 + std::sqrt(3.0));
  EXPECT_NEAR(comb[0], a, 1e-4);
  EXPECT_NEAR(comb[1], 1 - a, 1e-4);
  EXPECT_NEAR(comb[2], 1 - a, 1e-4);
  EXPECT_NEAR(comb[3], a, 1e-4);
  EXPECT_NEAR(pre[0], 0.5 + 1e-6, 1e-7);
  EXPECT_NEAR(post[0], 1.0, 1e-7);
}

TEST(V4HyperConnection, HeadFormsPreOnly) {
  CpuOps ops({1});
  std::vector<float> mix = {1, 2}, base = {0.5f, -1}, scale = {2};
  std::vector<float> pre(2);
  ops.hc_weights(f32(pre, {1, 2}), {}, {}, f32(mix, {1, 2}), f32(base, {2}), f32(scale, {1}), 1, 0.25f);
  EXPECT_NEAR(pre[0], sigmoid(2.5) + 0.25, 1e-6);
  EXPECT_NEAR(pre[1], sigmoid(3.0) + 0.25, 1e-6);
}

TEST(V4HyperConnection, CollapseAndExpand) {
  CpuOps ops({1});
  // One token, n = 2 streams of D = 2: s0 = [1, 2], s1 = [10, 20].
  std::vector<float> streams = {1, 2, 10, 20}, pre = {0.5f, 2}, out(2);
  ops.hc_collapse(f32(out, {1, 2}), f32(streams, {1, 4}), f32(pre, {1, 2}));
  EXPECT_FLOAT_EQ(out[0], 20.5f);
  EXPECT_FLOAT_EQ(out[1], 41.0f);
  // new_k = post_k * y + sum_j comb[j][k] * s_j (comb's first index is the input stream).
  std::vector<float> post = {1, 3}, comb = {0.25f, 0.75f, 0.5f, 0.5f}, y = {100, 200}, next(4);
  ops.hc_expand(f32(next, {1, 4}), f32(streams, {1, 4}), f32(post, {1, 2}), f32(comb, {1, 4}),
                f32(y, {1, 2}));
  EXPECT_FLOAT_EQ(next[0], 100 + 0.25f * 1 + 0.5f * 10);
  EXPECT_FLOAT_EQ(next[1], 200 + 0.25f * 2 + 0.5f * 20);
  EXPECT_FLOAT_EQ(next[2], 300 + 0.75f * 1 + 0.5f * 10);
  EXPECT_FLOAT_EQ(next[3], 600 + 0.75f * 2 + 0.5f * 20);
}

TEST(V4Compressor, PoolsEachCompleteWindowWithGateSoftmaxAndPositionBias) {
  CpuOps ops({1});
  // rate 2, d = 1, five rows: two windows, the fifth row waits for its window.
  std::vector<float> kv = {1, 2, 3, 4, 100}, gate = {0, std::log(3.0f), 0, 0, 50};
  std::vector<float> ape = {0, 0}, out(2);
  ops.compress_pool(f32(out, {2, 1}), f32(kv, {5, 1}), f32(gate, {5, 1}), f32(ape, {2, 1}), 2, false);
  EXPECT_NEAR(out[0], 0.25 * 1 + 0.75 * 2, 1e-6);
  EXPECT_NEAR(out[1], 3.5, 1e-6);
  ape = {std::log(3.0f), 0};  // the bias of the window's first slot
  ops.compress_pool(f32(out, {2, 1}), f32(kv, {5, 1}), f32(gate, {5, 1}), f32(ape, {2, 1}), 2, false);
  EXPECT_NEAR(out[0], 0.5 * 1 + 0.5 * 2, 1e-6);
  EXPECT_NEAR(out[1], 0.75 * 3 + 0.25 * 4, 1e-6);
}

TEST(V4Compressor, OverlappingWindowsTakeThePreviousWindowsFirstSeries) {
  CpuOps ops({1});
  // rate 2, d = 1, rows [a_i | b_i]: window 0 pools b0, b1; window 1 pools a0, a1 (window 0's first
  // series) and b2, b3; window 2 pools a2, a3, b4, b5.
  std::vector<float> kv = {1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60};
  std::vector<float> gate(12, 0.0f), ape(4, 0.0f), out(3);
  ops.compress_pool(f32(out, {3, 1}), f32(kv, {6, 2}), f32(gate, {6, 2}), f32(ape, {2, 2}), 2, true);
  EXPECT_NEAR(out[0], (10 + 20) / 2.0, 1e-5);
  EXPECT_NEAR(out[1], (1 + 2 + 30 + 40) / 4.0, 1e-5);
  EXPECT_NEAR(out[2], (3 + 4 + 50 + 60) / 4.0, 1e-5);
  // The ape's first half biases the borrowed slots: slot 0 of the previous window gets +ln 3.
  ape = {std::log(3.0f), 0, 0, 0};
  ops.compress_pool(f32(out, {3, 1}), f32(kv, {6, 2}), f32(gate, {6, 2}), f32(ape, {2, 2}), 2, true);
  EXPECT_NEAR(out[1], (3 * 1 + 2 + 30 + 40) / 6.0, 1e-5);
}

// Indexer with one head of width 1, rate 1 (entry w is complete at row w): score = relu(q k) * w.
std::vector<int32_t> indexer(std::vector<float> q, std::vector<float> keys, int k, int rate = 1) {
  CpuOps ops({1});
  const int64_t T = int64_t(q.size()), W = int64_t(keys.size());
  std::vector<float> w(size_t(T), 1.0f);
  std::vector<int32_t> ids(size_t(T * k));
  ops.indexer_topk(i32(ids, {T, k}), Tensor::make(q.data(), DType::kF32, {T, 1, 1}), f32(keys, {W, 1}),
                   f32(w, {T, 1}), rate, 1.0f, 1.0f, 0);
  return ids;
}

TEST(V4Indexer, TopKOfCompleteEntriesOnlyPaddedWithMinusOne) {
  // Row t sees entries 0..t; the largest key is the last one, not visible before row 3.
  auto ids = indexer({1, 1, 1, 1}, {1, 3, 2, 9}, 2);
  auto row = [&](int t) {
    std::vector<int32_t> r(ids.begin() + 2 * t, ids.begin() + 2 * t + 2);
    std::sort(r.begin(), r.end());
    return r;
  };
  EXPECT_EQ(row(0), (std::vector<int32_t>{-1, 0}));
  EXPECT_EQ(row(1), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(row(2), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(row(3), (std::vector<int32_t>{1, 3}));
  // rate 2: entry w is complete at row 2w + 1; row 0 sees none.
  auto r2 = indexer({1, 1, 1}, {5}, 1, 2);
  EXPECT_EQ(r2, (std::vector<int32_t>{-1, 0, 0}));
}

TEST(V4Indexer, TiesAtTheCutKeepEveryLargerEntryAndDistinctTiedOnes) {
  // Negative keys score 0 after the ReLU: entries 1, 2, 4 tie at 0 below entries 0 and 3.
  const std::vector<float> keys = {2, -1, -3, 5, -2};
  auto ids = indexer({1, 1, 1, 1, 1}, keys, 3);
  std::vector<int32_t> last(ids.end() - 3, ids.end());
  std::sort(last.begin(), last.end());
  EXPECT_TRUE(std::binary_search(last.begin(), last.end(), 0));
  EXPECT_TRUE(std::binary_search(last.begin(), last.end(), 3));
  EXPECT_EQ(std::adjacent_find(last.begin(), last.end()), last.end());  // distinct
  for (int32_t e : last) {
    ASSERT_GE(e, 0);
    if (e != 0 && e != 3) {
      EXPECT_LT(keys[size_t(e)], 0.0f) << "a tied (zero-score) entry";
    }
  }
}

TEST(V4SinkAttention, WindowCompressedEntriesAndSink) {
  CpuOps ops({1});
  // H = 1, D = 1, q = 1, scale 1: the logit of a row is its value.
  std::vector<float> q = {1, 1, 1, 1}, kv = {1, 2, 3, 4}, sinks = {0.5f}, out(4);
  Tensor qt = Tensor::make(q.data(), DType::kF32, {4, 1, 1});
  Tensor ot = Tensor::make(out.data(), DType::kF32, {4, 1, 1});
  auto softmax_mean = [](std::vector<double> rows, double sink) {
    double z = std::exp(sink), acc = 0;
    for (double r : rows) z += std::exp(r);
    for (double r : rows) acc += std::exp(r) / z * r;
    return acc;
  };
  // Window 2, no compressed entries: row t sees rows t-1, t.
  ops.sink_attention(ot, qt, f32(kv, {4, 1}), {}, {}, f32(sinks, {1}), 2, 0, 1.0f, 0, 0);
  EXPECT_NEAR(out[0], softmax_mean({1}, 0.5), 1e-6);
  EXPECT_NEAR(out[3], softmax_mean({3, 4}, 0.5), 1e-6);
  // HCA, rate 2: entry w is visible from row 2w + 1 on.
  std::vector<float> comp = {-1, 0.25f};
  ops.sink_attention(ot, qt, f32(kv, {4, 1}), f32(comp, {2, 1}), {}, f32(sinks, {1}), 1, 2, 1.0f, 0, 0);
  EXPECT_NEAR(out[0], softmax_mean({1}, 0.5), 1e-6);
  EXPECT_NEAR(out[1], softmax_mean({2, -1}, 0.5), 1e-6);
  EXPECT_NEAR(out[3], softmax_mean({4, -1, 0.25}, 0.5), 1e-6);
  // CSA: only the selected entries (-1: none).
  std::vector<int32_t> sel = {-1, -1, 0, -1, -1, -1, 1, -1};
  ops.sink_attention(ot, qt, f32(kv, {4, 1}), f32(comp, {2, 1}), i32(sel, {4, 2}), f32(sinks, {1}), 1, 2,
                     1.0f, 0, 0);
  EXPECT_NEAR(out[1], softmax_mean({2, -1}, 0.5), 1e-6);
  EXPECT_NEAR(out[2], softmax_mean({3}, 0.5), 1e-6);
  EXPECT_NEAR(out[3], softmax_mean({4, 0.25}, 0.5), 1e-6);
}

// Incremental decode: queries at positions first_pos.. against the tail of kv that starts at
// kv_first give exactly the rows of the full run (window 2, HCA rate 2).
TEST(V4SinkAttention, QueriesAtAnOffsetEqualTheFullRunsRows) {
  CpuOps ops({1});
  std::vector<float> q = {1, 0.5f, -1, 2, 1, -0.5f}, kv = {1, 2, 3, 4, 5, 6}, comp = {-1, 0.25f, 2},
                     sinks = {0.5f}, full(6), part(2);
  ops.sink_attention(Tensor::make(full.data(), DType::kF32, {6, 1, 1}),
                     Tensor::make(q.data(), DType::kF32, {6, 1, 1}), f32(kv, {6, 1}), f32(comp, {3, 1}), {},
                     f32(sinks, {1}), 2, 2, 1.0f, 0, 0);
  // Rows 4, 5 with kv rows 3..5 only.
  ops.sink_attention(Tensor::make(part.data(), DType::kF32, {2, 1, 1}),
                     Tensor::make(q.data() + 4, DType::kF32, {2, 1, 1}),
                     Tensor::make(kv.data() + 3, DType::kF32, {3, 1}), f32(comp, {3, 1}), {}, f32(sinks, {1}),
                     2, 2, 1.0f, 4, 3);
  EXPECT_EQ(part[0], full[4]);
  EXPECT_EQ(part[1], full[5]);
  // A kv tail that misses a row of the first query's window is refused.
  EXPECT_THROW(ops.sink_attention(Tensor::make(part.data(), DType::kF32, {2, 1, 1}),
                                  Tensor::make(q.data() + 4, DType::kF32, {2, 1, 1}),
                                  Tensor::make(kv.data() + 4, DType::kF32, {2, 1}), f32(comp, {3, 1}), {},
                                  f32(sinks, {1}), 2, 2, 1.0f, 4, 4),
               Error);
}

TEST(V4Indexer, RowsAtAnOffsetSeeTheEntriesCompleteByTheirPosition) {
  // rate 2, entries {5, 1, 7}; rows at positions 4, 5: position 4 sees entries 0, 1; position 5 all
  // three (top 2: entries 0 and 2).
  CpuOps ops({1});
  std::vector<float> q = {1, 1}, keys = {5, 1, 7}, w = {1, 1};
  std::vector<int32_t> ids(4);
  ops.indexer_topk(i32(ids, {2, 2}), Tensor::make(q.data(), DType::kF32, {2, 1, 1}), f32(keys, {3, 1}),
                   f32(w, {2, 1}), 2, 1.0f, 1.0f, 4);
  std::sort(ids.begin(), ids.begin() + 2);
  std::sort(ids.begin() + 2, ids.end());
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1, 0, 2}));
}

double sqrtsoftplus(double z) {
  return std::sqrt(std::log1p(std::exp(z)));
}

TEST(V4Routing, HashLayersTakeExpertsFromTheTokenTable) {
  CpuOps ops({1});
  std::vector<float> logits = {0, 1, 2, -1, 0, 1, 2, -1}, w(4);
  std::vector<int32_t> table = {3, 0, 1, 2, 2, 1}, tokens = {2, 0}, ids(4);
  ops.moe_route_v4(i32(ids, {2, 2}), f32(w, {2, 2}), f32(logits, {2, 4}), {}, i32(table, {3, 2}),
                   i32(tokens, {2}), RouterScoring::kSqrtSoftplus, 1.5f);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 1, 3, 0}));
  const double a = sqrtsoftplus(2), b = sqrtsoftplus(1);
  EXPECT_NEAR(w[0], a / (a + b) * 1.5, 1e-6);
  EXPECT_NEAR(w[1], b / (a + b) * 1.5, 1e-6);
  const double c = sqrtsoftplus(-1), d = sqrtsoftplus(0);
  EXPECT_NEAR(w[2], c / (c + d) * 1.5, 1e-6);
}

TEST(V4Routing, LearnedLayersSelectWithBiasButWeighUnbiasedScores) {
  CpuOps ops({1});
  std::vector<float> logits = {3, 2, 1, 0}, bias = {0, 0, 5, 0}, w(2);
  std::vector<int32_t> ids(2);
  ops.moe_route_v4(i32(ids, {1, 2}), f32(w, {1, 2}), f32(logits, {1, 4}), f32(bias, {4}), {}, {},
                   RouterScoring::kSqrtSoftplus, 1.0f);
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 0}));
  const double a = sqrtsoftplus(1), b = sqrtsoftplus(3);
  EXPECT_NEAR(w[0], a / (a + b), 1e-6);
  EXPECT_NEAR(w[1], b / (a + b), 1e-6);
}

TEST(V4Experts, SwigluLimitClampsGateAboveAndUpBothWays) {
  CpuOps ops({1});
  std::vector<float> g = {20}, u = {-30}, dn = {1}, x = {1}, out(1), wt = {1};
  std::vector<int32_t> ids = {0};
  ExpertWeights e{weight(f32(g, {1, 1})), weight(f32(u, {1, 1})), weight(f32(dn, {1, 1})), 10.0f};
  ops.moe_experts(f32(out, {1, 1}), f32(x, {1, 1}), i32(ids, {1, 1}), f32(wt, {1, 1}), {&e, 1}, nullptr);
  EXPECT_NEAR(out[0], 10 * sigmoid(10) * -10, 1e-4);
  e.swiglu_limit = 0;  // unclamped
  ops.moe_experts(f32(out, {1, 1}), f32(x, {1, 1}), i32(ids, {1, 1}), f32(wt, {1, 1}), {&e, 1}, nullptr);
  EXPECT_NEAR(out[0], 20 * sigmoid(20) * -30, 1e-3);
}

}  // namespace
}  // namespace beluga
