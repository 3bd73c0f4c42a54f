// SpecGate's decision: verify drafts only while expected tokens per second beat plain decode at the
// step's batch bucket, from measured costs and acceptance; exploration, outliers, reprobing, and
// "fixed" gating.
#include "engine/spec_gate.h"

#include <gtest/gtest.h>

namespace beluga {
namespace {

// Feeds `n` steady steps of shape (batch, k) costing `seconds` each (the first is dropped as the
// graph-recording one).
void feed(SpecGate& g, int batch, int k, double seconds, int n = SpecGate::kMinSamples + 1) {
  for (int i = 0; i < n; ++i) g.observe_cost(batch, k, seconds);
}

// Accepts the first `a` of `v` verified drafts, `n` times.
void accept(SpecGate& g, int v, int a, int n) {
  for (int i = 0; i < n; ++i) g.observe_acceptance(v, a);
}

TEST(SpecGate, FixedAlwaysVerifiesK) {
  SpecGate g(3, true);
  feed(g, 64, 0, 1e-3);
  feed(g, 64, 3, 1.0);  // ignored: fixed gating measures nothing
  EXPECT_EQ(g.choose(64), 3);
  EXPECT_LT(g.cost(64, 3), 0);
}

TEST(SpecGate, ExploresEachShapeDeepestFirst) {
  SpecGate g(2, false);
  EXPECT_EQ(g.choose(1), 2);
  feed(g, 1, 2, 1e-3, SpecGate::kSkipSamples + SpecGate::kMinSamples - 1);
  EXPECT_EQ(g.choose(1), 2);  // one sample short
  EXPECT_LT(g.cost(1, 2), 0);
  g.observe_cost(1, 2, 1e-3);
  EXPECT_DOUBLE_EQ(g.cost(1, 2), 1e-3);
  EXPECT_EQ(g.choose(1), 1);
  feed(g, 1, 1, 1e-3);
  EXPECT_EQ(g.choose(1), 0);
  feed(g, 1, 0, 1e-3);
  // Equal costs: the most drafts win (expected tokens grow with k at any acceptance above 0).
  EXPECT_EQ(g.choose(1), 2);
}

TEST(SpecGate, FallsBackToPlainWhereVerifyCostsMoreThanItGains) {
  SpecGate g(1, false);
  accept(g, 1, 1, 90);
  accept(g, 1, 0, 10);
  const double e1 = g.expected_tokens(1);
  EXPECT_NEAR(e1, 1.0 + 91.0 / 102.0, 0.05);  // decayed counts, prior 1/2
  // Batch 1: verify 1.2x a plain step, 1.89 tokens: speculate. Batch 64: verify 2.5x: plain.
  feed(g, 1, 0, 1.0e-3);
  feed(g, 1, 1, 1.2e-3);
  feed(g, 64, 0, 1.0e-3);
  feed(g, 64, 1, 2.5e-3);
  EXPECT_EQ(g.choose(1), 1);
  EXPECT_EQ(g.choose(64), 0);
  // Batches share their bucket's measurements (48 -> 48, 60 -> 64).
  EXPECT_EQ(g.choose(60), 0);
  EXPECT_EQ(g.cost(60, 1), g.cost(64, 1));
  // Just below break-even (1.2e-3 * ~1.89 = 2.27e-3) it speculates again.
  SpecGate h(1, false);
  accept(h, 1, 1, 90);
  accept(h, 1, 0, 10);
  feed(h, 64, 0, 1.2e-3);
  feed(h, 64, 1, 0.99 * 1.2e-3 * h.expected_tokens(1));
  EXPECT_EQ(h.choose(64), 1);
}

TEST(SpecGate, DepthFollowsAcceptancePerPosition) {
  SpecGate g(2, false);
  feed(g, 8, 0, 1.0e-3);
  feed(g, 8, 1, 1.3e-3);
  feed(g, 8, 2, 1.6e-3);
  // The second draft is almost never right: one draft beats two.
  accept(g, 2, 1, 200);
  EXPECT_LT(g.prefix_acceptance(2), 0.05);
  EXPECT_GT(g.prefix_acceptance(1), 0.95);
  EXPECT_EQ(g.choose(8), 1);
  // Both right from now on: the decayed counts follow, and two drafts win.
  accept(g, 2, 2, 800);
  EXPECT_GT(g.prefix_acceptance(2), 0.9);
  EXPECT_EQ(g.choose(8), 2);
  // Nothing accepted: plain decode.
  accept(g, 2, 0, 1500);
  EXPECT_LT(g.prefix_acceptance(1), 0.05);
  EXPECT_EQ(g.choose(8), 0);
}

TEST(SpecGate, DropsStallsAndReprobes) {
  SpecGate g(1, false);
  accept(g, 1, 1, 100);
  feed(g, 16, 0, 1.0e-3);
  feed(g, 16, 1, 1.1e-3);
  // A stall (an idle engine, a graph recorded at a new width) does not move the average.
  g.observe_cost(16, 1, 50e-3);
  EXPECT_DOUBLE_EQ(g.cost(16, 1), 1.1e-3);
  // A real rise does: speculation turns unprofitable at this bucket.
  feed(g, 16, 1, 4.0e-3, 40);
  EXPECT_GT(g.cost(16, 1), 3.5e-3);
  int plain = 0, spec = 0;
  for (int i = 0; i < SpecGate::kReprobe; ++i) {
    const int k = g.choose(16);
    (k == 0 ? plain : spec)++;
    g.observe_cost(16, k, k == 0 ? 1.0e-3 : 4.0e-3);
  }
  // Mostly plain, and every kReprobe decisions the speculating shape is measured again.
  EXPECT_GE(spec, 1);
  EXPECT_LE(spec, SpecGate::kMinSamples);
  EXPECT_GT(plain, SpecGate::kReprobe - 2 * SpecGate::kMinSamples);
}

}  // namespace
}  // namespace beluga
