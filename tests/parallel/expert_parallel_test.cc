// The expert-parallel MoE layer over 2 and 4 thread ranks against Ops::moe on one rank over all
// tokens: random F32 weights, EPLB-style replicated slots, and a real MoE layer of the dsv2-lite-tiny
// fixture (BF16). Tolerance: max |ep - ref| <= 1e-6 * max |ref| (float rounding: the routed products
// are weighted on the expert's rank and summed with add(), where Ops::moe fuses the two; observed
// differences are 1e-7 of max |ref|: an ulp or two).
#include "parallel/expert_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "loader/weight_source.h"
#include "parallel/shard_weight_source.h"
#include "run_ranks.h"

namespace beluga {
namespace {

using test::run_ranks;

// Host storage for F32 tensors the test makes.
struct Arena {
  std::vector<std::unique_ptr<std::vector<float>>> bufs;
  Tensor random(std::initializer_list<int64_t> shape, float scale, std::mt19937& rng) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto v = std::make_unique<std::vector<float>>(size_t(n));
    std::uniform_real_distribution<float> u(-scale, scale);
    for (float& x : *v) x = u(rng);
    Tensor t = Tensor::make(v->data(), DType::kF32, shape);
    bufs.push_back(std::move(v));
    return t;
  }
};

ExpertWeights expert(Tensor gate, Tensor up, Tensor down) {
  ExpertWeights e;
  e.gate.w = gate;
  e.up.w = up;
  e.down.w = down;
  return e;
}

// One MoE layer's weights, the input rows of all ranks and the reference output.
struct MoeCase {
  int64_t D = 0;
  Weight router;
  Tensor bias, norm;
  RouterParams params;
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
  bool has_shared = false;
  std::vector<float> x;  // [T, D] residual rows of all tokens
  int64_t T() const { return int64_t(x.size()) / D; }

  MoeLayerRef ref() const { return {router, bias, params, experts, has_shared ? &shared : nullptr}; }

  // Ops::moe over all tokens on one backend.
  std::vector<float> reference() const {
    CpuOps ops(CpuOptions{1});
    std::vector<float> res(x), normed(x.size()), out(x.size());
    NormedInput in{Tensor::make(res.data(), DType::kF32, {T(), D}),    {},    norm,
                   Tensor::make(normed.data(), DType::kF32, {T(), D}), 1e-6f, {}};
    ops.moe(Tensor::make(out.data(), DType::kF32, {T(), D}), in, ref());
    return out;
  }

  // ExpertParallelMoe on `ranks` thread ranks; rank r has the tokens [split[r], split[r + 1]).
  // `load` gives a rank its experts (default: the slots' experts of `experts`).
  std::vector<float> expert_parallel(const ExpertSharding& sharding, const std::vector<int64_t>& split,
                                     ExpertParallelMoe::Traffic* traffic = nullptr) const {
    const int n = sharding.ranks();
    std::vector<float> out(x.size(), NAN);
    std::vector<ExpertParallelMoe::Traffic> t(static_cast<size_t>(n));
    run_ranks(n, [&](Communicator& comm) {
      const int r = comm.rank();
      CpuOps ops(CpuOptions{1});
      std::vector<ExpertWeights> mine;
      for (int e : sharding.local_experts(r)) mine.push_back(experts[size_t(e)]);
      const int64_t t0 = split[size_t(r)], rows = split[size_t(r) + 1] - t0;
      std::vector<float> res(x.begin() + t0 * D, x.begin() + (t0 + rows) * D), normed(res.size());
      NormedInput in{Tensor::make(res.data(), DType::kF32, {rows, D}),    {},    norm,
                     Tensor::make(normed.data(), DType::kF32, {rows, D}), 1e-6f, {}};
      ExpertParallelMoe ep(ops, comm, sharding);
      ep.forward(Tensor::make(out.data() + t0 * D, DType::kF32, {rows, D}), in,
                 {router, bias, params, mine, has_shared ? &shared : nullptr});
      t[size_t(r)] = ep.traffic();
    });
    if (traffic)
      for (const auto& x : t) {
        traffic->sent_bytes += x.sent_bytes;
        traffic->local_bytes += x.local_bytes;
        traffic->dispatched_rows += x.dispatched_rows;
      }
    return out;
  }
};

// forward_replicated on `n` ranks: every rank has all tokens; returns each rank's output.
std::vector<std::vector<float>> replicated(const MoeCase& c, int n) {
  const ExpertSharding sharding = ExpertSharding::contiguous(int(c.experts.size()), n);
  std::vector<std::vector<float>> outs(static_cast<size_t>(n), std::vector<float>(c.x.size(), NAN));
  run_ranks(n, [&](Communicator& comm) {
    const int r = comm.rank();
    CpuOps ops(CpuOptions{1});
    std::vector<ExpertWeights> mine;
    for (int e : sharding.local_experts(r)) mine.push_back(c.experts[size_t(e)]);
    std::vector<float> res(c.x), normed(res.size());
    NormedInput in{Tensor::make(res.data(), DType::kF32, {c.T(), c.D}),    {},    c.norm,
                   Tensor::make(normed.data(), DType::kF32, {c.T(), c.D}), 1e-6f, {}};
    ExpertParallelMoe ep(ops, comm, sharding);
    ep.forward_replicated(Tensor::make(outs[size_t(r)].data(), DType::kF32, {c.T(), c.D}), in,
                          {c.router, c.bias, c.params, mine, c.has_shared ? &c.shared : nullptr});
  });
  return outs;
}

MoeCase random_case(Arena& a, int64_t T, int64_t D, int64_t I, int E, int K, uint32_t seed) {
  std::mt19937 rng(seed);
  MoeCase c;
  c.D = D;
  c.router.w = a.random({E, D}, 1.0f, rng);
  c.norm = a.random({D}, 1.0f, rng);
  c.params.top_k = K;
  c.params.norm_topk_prob = true;
  c.params.routed_scaling_factor = 2.5f;
  c.params.scoring = RouterScoring::kSigmoid;
  c.bias = a.random({E}, 0.1f, rng);
  const float sd = 1.0f / std::sqrt(float(D)), si = 1.0f / std::sqrt(float(I));
  for (int e = 0; e < E; ++e)
    c.experts.push_back(
        expert(a.random({I, D}, sd, rng), a.random({I, D}, sd, rng), a.random({D, I}, si, rng)));
  c.shared =
      expert(a.random({2 * I, D}, sd, rng), a.random({2 * I, D}, sd, rng), a.random({D, 2 * I}, si, rng));
  c.has_shared = true;
  Tensor x = a.random({T, D}, 2.0f, rng);
  c.x.assign(x.ptr<float>(), x.ptr<float>() + T * D);
  return c;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
  ASSERT_EQ(got.size(), ref.size());
  float mx = 0, diff = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    mx = std::max(mx, std::fabs(ref[i]));
    diff = std::max(diff, std::fabs(got[i] - ref[i]));  // NaN (a row never written) fails below
    ASSERT_FALSE(std::isnan(got[i])) << what << ": element " << i << " not written";
  }
  EXPECT_GT(mx, 0.0f);
  EXPECT_LE(diff, 1e-6f * mx) << what << ": max |diff| " << diff << " against max |ref| " << mx;
}

TEST(ExpertParallelMoe, RandomWeightsTwoAndFourRanksMatchOneRank) {
  Arena a;
  const MoeCase c = random_case(a, 19, 48, 24, 8, 3, 7);
  const std::vector<float> ref = c.reference();
  expect_close(c.expert_parallel(ExpertSharding::contiguous(8, 1), {0, 19}), ref, "1 rank");
  expect_close(c.expert_parallel(ExpertSharding::contiguous(8, 2), {0, 11, 19}), ref, "2 ranks");
  // Uneven token counts, one rank without tokens, and 8 experts over 3 ranks (3, 3, 2).
  expect_close(c.expert_parallel(ExpertSharding::contiguous(8, 4), {0, 5, 5, 12, 19}), ref, "4 ranks");
  expect_close(c.expert_parallel(ExpertSharding::contiguous(8, 3), {0, 1, 18, 19}), ref, "3 ranks");
}

TEST(ExpertParallelMoe, ReplicatedSlotsFromAPlacementMatchOneRank) {
  Arena a;
  const MoeCase c = random_case(a, 16, 32, 16, 6, 2, 11);
  // 8 slots for 6 experts over 2 ranks (an EPLB-style placement: experts 1 and 4 twice, reordered).
  const ExpertSharding s(6, 2, {4, 1, 0, 2, 5, 3, 1, 4});
  expect_close(c.expert_parallel(s, {0, 9, 16}), c.reference(), "replicas");
}

// Every rank holds all tokens; each routes a share (3 tokens over 4 ranks: one rank has none).
TEST(ExpertParallelMoe, ReplicatedTokensGiveEveryRankTheWholeOutput) {
  Arena a;
  for (int64_t T : {3, 13}) {
    const MoeCase c = random_case(a, T, 32, 16, 8, 3, 21);
    const std::vector<float> ref = c.reference();
    for (int n : {2, 4})
      for (const auto& out : replicated(c, n)) expect_close(out, ref, "replicated tokens");
  }
}

TEST(ExpertParallelMoe, ResultDoesNotDependOnTheRun) {
  Arena a;
  const MoeCase c = random_case(a, 24, 32, 16, 8, 2, 3);
  const ExpertSharding s = ExpertSharding::contiguous(8, 4);
  const std::vector<int64_t> split = {0, 6, 12, 18, 24};
  const std::vector<float> first = c.expert_parallel(s, split);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.expert_parallel(s, split), first);
}

TEST(ExpertParallelMoe, NoTokensAnywhereStillRunsTheCollectives) {
  Arena a;
  MoeCase c = random_case(a, 1, 16, 8, 4, 2, 5);
  c.x.clear();
  EXPECT_TRUE(c.expert_parallel(ExpertSharding::contiguous(4, 2), {0, 0, 0}).empty());
}

TEST(ExpertParallelMoe, TrafficCountsRowsSentToOtherRanks) {
  Arena a;
  const MoeCase c = random_case(a, 10, 16, 8, 4, 2, 9);
  ExpertParallelMoe::Traffic one, two;
  c.expert_parallel(ExpertSharding::contiguous(4, 1), {0, 10}, &one);
  EXPECT_EQ(one.sent_bytes, 0u);  // a group of one keeps everything
  EXPECT_EQ(one.dispatched_rows, 20u);
  c.expert_parallel(ExpertSharding::contiguous(4, 2), {0, 5, 10}, &two);
  EXPECT_EQ(two.dispatched_rows, 20u);
  // Each (token, expert) pair goes out and comes back once: a row + slot + weight out, a row back.
  const uint64_t per_pair = 16 * 4 + 8 + 16 * 4;
  EXPECT_EQ(one.local_bytes, 20 * per_pair);
  EXPECT_EQ(two.sent_bytes + two.local_bytes, 20 * per_pair);
  EXPECT_GT(two.sent_bytes, 0u);
}

// A real MoE layer: dsv2-lite-tiny's layer 1 (8 experts, top-3, greedy softmax routing, 2 shared
// experts, BF16), each rank loading only its experts through ShardWeightSource.
TEST(ExpertParallelMoe, FixtureLayerMatchesOneRank) {
  const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv2-lite-tiny";
  Checkpoint ckpt(dir);
  const int64_t D = 64, I = 32, E = 8;
  const std::string p = "model.layers.1.mlp.";
  for (int n : {2, 4}) {
    const ExpertSharding s = ExpertSharding::contiguous(int(E), n);
    // The reference takes every expert from the checkpoint; each EP rank only its own (checked by
    // loading them through its ShardWeightSource: another rank's expert would throw).
    MoeCase c;
    c.D = D;
    c.router.w = ckpt.get(p + "gate.weight", {E, D}, DType::kBF16);
    c.norm = ckpt.get("model.layers.1.post_attention_layernorm.weight", {D}, DType::kBF16);
    c.params.top_k = 3;
    c.params.scoring = RouterScoring::kSoftmax;
    c.experts.resize(size_t(E));
    for (int r = 0; r < n; ++r) {
      ShardWeightSource src(ckpt, s, r);
      for (int e : s.local_experts(r)) {
        const std::string ep = p + "experts." + std::to_string(e) + ".";
        c.experts[size_t(e)] =
            expert(src.get(ep + "gate_proj.weight", {I, D}), src.get(ep + "up_proj.weight", {I, D}),
                   src.get(ep + "down_proj.weight", {D, I}));
      }
      EXPECT_TRUE(
          src.find(p + "experts." + std::to_string(s.local_experts((r + 1) % n)[0]) + ".up_proj.weight",
                   {I, D})
              .empty());
    }
    c.shared = expert(ckpt.get(p + "shared_experts.gate_proj.weight", {2 * I, D}, DType::kBF16),
                      ckpt.get(p + "shared_experts.up_proj.weight", {2 * I, D}, DType::kBF16),
                      ckpt.get(p + "shared_experts.down_proj.weight", {D, 2 * I}, DType::kBF16));
    c.has_shared = true;
    std::mt19937 rng(42);
    std::normal_distribution<float> g(0.0f, 1.0f);
    c.x.resize(size_t(21 * D));
    for (float& v : c.x) v = g(rng);
    std::vector<int64_t> split = {0};
    for (int r = 0; r < n; ++r) split.push_back(21 * (r + 1) / n);
    expect_close(c.expert_parallel(s, split), c.reference(),
                 n == 2 ? "fixture, 2 ranks" : "fixture, 4 ranks");
  }
}

}  // namespace
}  // namespace beluga
