// MoE gate variants on small hand-checked cases: softmax greedy (V2-Lite), group-limited greedy
// (V2), sigmoid with correction bias and top-2-sum groups (V3 noaux_tc).
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cpu/cpu_ops.h"

namespace beluga {
namespace {

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

Routed route(std::vector<float> logits, std::vector<float> bias, const RouterParams& p) {
  CpuOps ops({1});
  const int64_t E = int64_t(logits.size());
  Routed r{std::vector<int32_t>(p.top_k), std::vector<float>(p.top_k)};
  Tensor lt = Tensor::make(logits.data(), DType::kF32, {1, E});
  Tensor bt = bias.empty() ? Tensor{} : Tensor::make(bias.data(), DType::kF32, {E});
  ops.moe_route(Tensor::make(r.ids.data(), DType::kI32, {1, p.top_k}),
                Tensor::make(r.w.data(), DType::kF32, {1, p.top_k}), lt, bt, p);
  return r;
}

TEST(MoeRoute, SoftmaxGreedyTakesTopKProbabilities) {
  RouterParams p;
  p.top_k = 2;
  p.routed_scaling_factor = 1.0f;
  std::vector<float> z = {0.0f, 2.0f, 1.0f, std::log(3.0f)};
  Routed r = route(z, {}, p);
  const double sum = 1 + std::exp(2.0) + std::exp(1.0) + 3;
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3}));
  EXPECT_NEAR(r.w[0], std::exp(2.0) / sum, 1e-6);
  EXPECT_NEAR(r.w[1], 3.0 / sum, 1e-6);  // not renormalised (norm_topk_prob false)
}

TEST(MoeRoute, GroupLimitedGreedyUsesGroupMax) {
  // Two groups of 3: group 0 max 5 (expert 0), group 1 has two 4s. With one group kept the top-2 come
  // from group 0 even though group 1's second-best beats group 0's.
  RouterParams p;
  p.top_k = 2;
  p.n_group = 2;
  p.topk_group = 1;
  p.routed_scaling_factor = 16.0f;
  Routed r = route({5, 0, 1, 4, 4, -1}, {}, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 2}));
  const double sum = std::exp(5) + 1 + std::exp(1) + 2 * std::exp(4) + std::exp(-1);
  EXPECT_NEAR(r.w[0], 16 * std::exp(5) / sum, 1e-5);
  EXPECT_NEAR(r.w[1], 16 * std::exp(1) / sum, 1e-5);
}

TEST(MoeRoute, SigmoidNoauxTcBiasSelectsButDoesNotWeigh) {
  // Four groups of two, keep 2 groups by the sum of their top-2 biased scores; the bias moves expert 7
  // into the selection, but its weight is its unbiased sigmoid, renormalised and scaled by 2.5.
  RouterParams p;
  p.scoring = RouterScoring::kSigmoid;
  p.top_k = 2;
  p.n_group = 4;
  p.topk_group = 2;
  p.group_by_top2_sum = true;
  p.norm_topk_prob = true;
  p.routed_scaling_factor = 2.5f;
  std::vector<float> z = {1.0f, 0.0f, 2.0f, -3.0f, 0.5f, 0.5f, -2.0f, -1.0f};
  std::vector<float> bias = {0, 0, 0, 0, 0, 0, 0, 1.5f};
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  // group sums: g0 = s(1)+s(0) = 1.231, g1 = s(2)+s(-3) = 0.928, g2 = 2 s(.5) = 1.245, g3 = s(-2)+s(-1)+1.5
  // = 1.888 kept groups: g3, g2 -> candidates 4, 5, 6, 7 with biased 0.622, 0.622, 0.119, 1.769 -> experts 7
  // then 4
  Routed r = route(z, bias, p);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{7, 4}));
  const double a = sig(-1.0), b = sig(0.5);
  EXPECT_NEAR(r.w[0], 2.5 * a / (a + b), 1e-6);
  EXPECT_NEAR(r.w[1], 2.5 * b / (a + b), 1e-6);
}

}  // namespace
}  // namespace beluga
