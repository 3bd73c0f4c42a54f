// SpecGate's decision: verify drafts only while expected tokens per second beat plain decode at the
// step's batch bucket, from measured costs and calibrated acceptance; per-draft confidence ranks the
// drafts ("confidence"), one depth for the batch ("cost"), exploration, outliers, reprobing, padding
// and "fixed" gating.
#include "engine/spec_gate.h"

#include <gtest/gtest.h>

namespace beluga {
namespace {

using Mode = SpecGate::Mode;

// Feeds `n` steady steps of shape (batch, k) costing `seconds` each (the first is dropped as the
// graph-recording one).
void feed(SpecGate& g, int batch, int k, double seconds, int n = SpecGate::kMinSamples + 1) {
  for (int i = 0; i < n; ++i) g.observe_cost(batch, k, seconds);
}

// Accepts the first `a` of `v` verified unscored drafts, `n` times.
void accept(SpecGate& g, int v, int a, int n) {
  for (int i = 0; i < n; ++i) g.observe_acceptance(v, a, nullptr, false);
}

// The depth the gate picks for `batch` eligible decodes holding `held` unscored drafts each.
int choose(SpecGate& g, int batch, int held = 8) {
  std::vector<DraftScores> s(size_t(batch), DraftScores{std::min(held, g.max_k()), nullptr, false});
  std::vector<int> admit;
  return g.plan(batch, s, admit);
}

TEST(SpecGate, FixedAlwaysVerifiesK) {
  SpecGate g(3, Mode::kFixed, false);
  feed(g, 64, 0, 1e-3);
  feed(g, 64, 3, 1.0);  // ignored: fixed gating measures nothing
  EXPECT_EQ(choose(g, 64), 3);
  EXPECT_LT(g.cost(64, 3), 0);
}

TEST(SpecGate, ExploresEachShapeDeepestFirst) {
  SpecGate g(2, Mode::kCost, false);
  EXPECT_EQ(choose(g, 1), 2);
  feed(g, 1, 2, 1e-3, SpecGate::kSkipSamples + SpecGate::kMinSamples - 1);
  EXPECT_EQ(choose(g, 1), 2);  // one sample short
  EXPECT_LT(g.cost(1, 2), 0);
  g.observe_cost(1, 2, 1e-3);
  EXPECT_DOUBLE_EQ(g.cost(1, 2), 1e-3);
  EXPECT_EQ(choose(g, 1), 1);
  feed(g, 1, 1, 1e-3);
  EXPECT_EQ(choose(g, 1), 0);
  feed(g, 1, 0, 1e-3);
  // Equal costs: the most drafts win (expected tokens grow with k at any acceptance above 0).
  EXPECT_EQ(choose(g, 1), 2);
}

TEST(SpecGate, FallsBackToPlainWhereVerifyCostsMoreThanItGains) {
  SpecGate g(1, Mode::kCost, false);
  accept(g, 1, 1, 90);
  accept(g, 1, 0, 10);
  EXPECT_NEAR(g.mean_acceptance(0, false), 91.0 / 102.0, 0.05);  // decayed counts, prior 1/2
  // Batch 1: verify 1.2x a plain step, 1.89 tokens: speculate. Batch 64: verify 2.5x: plain.
  feed(g, 1, 0, 1.0e-3);
  feed(g, 1, 1, 1.2e-3);
  feed(g, 64, 0, 1.0e-3);
  feed(g, 64, 1, 2.5e-3);
  EXPECT_EQ(choose(g, 1), 1);
  EXPECT_EQ(choose(g, 64), 0);
  // Batches share their bucket's measurements (48 -> 48, 60 -> 64).
  EXPECT_EQ(choose(g, 60), 0);
  EXPECT_EQ(g.cost(60, 1), g.cost(64, 1));
  // Speculation must win by 5 %: at break-even (1.2e-3 * ~1.89 = 2.27e-3) less 3 % it stays plain,
  // less 6 % it speculates.
  for (double below : {0.97, 0.94}) {
    SpecGate h(1, Mode::kCost, false);
    accept(h, 1, 1, 90);
    accept(h, 1, 0, 10);
    feed(h, 64, 0, 1.2e-3);
    feed(h, 64, 1, below * 1.2e-3 * (1 + h.mean_acceptance(0, false)));
    EXPECT_EQ(choose(h, 64), below < 0.95 ? 1 : 0) << below;
  }
}

TEST(SpecGate, DepthFollowsAcceptancePerPosition) {
  SpecGate g(2, Mode::kCost, false);
  feed(g, 8, 0, 1.0e-3);
  feed(g, 8, 1, 1.3e-3);
  feed(g, 8, 2, 1.6e-3);
  // The second draft is almost never right: one draft beats two.
  accept(g, 2, 1, 200);
  EXPECT_LT(g.mean_acceptance(1, false), 0.05);
  EXPECT_GT(g.mean_acceptance(0, false), 0.95);
  EXPECT_EQ(choose(g, 8), 1);
  // Both right from now on: the decayed counts follow, and two drafts win.
  accept(g, 2, 2, 800);
  EXPECT_GT(g.mean_acceptance(0, false) * g.mean_acceptance(1, false), 0.9);
  EXPECT_EQ(choose(g, 8), 2);
  // Nothing accepted: plain decode.
  accept(g, 2, 0, 1500);
  EXPECT_LT(g.mean_acceptance(0, false), 0.05);
  EXPECT_EQ(choose(g, 8), 0);
}

TEST(SpecGate, DropsStallsAndReprobes) {
  SpecGate g(1, Mode::kCost, false);
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
    const int k = choose(g, 16);
    (k == 0 ? plain : spec)++;
    g.observe_cost(16, k, k == 0 ? 1.0e-3 : 4.0e-3);
  }
  // Mostly plain, and every kReprobe decisions both shapes are measured again from scratch (the
  // speculating one for its skipped and trusted samples).
  EXPECT_GE(spec, 1);
  EXPECT_LE(spec, SpecGate::kSkipSamples + SpecGate::kMinSamples);
  EXPECT_GT(plain, SpecGate::kReprobe - 3 * (SpecGate::kSkipSamples + SpecGate::kMinSamples));
  // A shape whose old cost was inflated (measured cold) is judged by fresh samples at the reprobe:
  // its steps now cost 1.1 ms, and within one reprobe period the gate speculates again.
  int after = 0;
  for (int i = 0; i < 2 * SpecGate::kReprobe; ++i) {
    const int k = choose(g, 16);
    if (i >= SpecGate::kReprobe) after += k;
    g.observe_cost(16, k, k == 0 ? 1.0e-3 : 1.1e-3);
  }
  EXPECT_GT(after, SpecGate::kReprobe - 3 * (SpecGate::kSkipSamples + SpecGate::kMinSamples));
}

// Calibration: each score bin learns its own acceptance (decayed counts, a prior at the bin's
// centre); greedy and sampled drafts are counted apart; unscored drafts have a bin of their own.
TEST(SpecGate, CalibratesEachScoreBin) {
  SpecGate g(2, Mode::kConfidence, false);
  EXPECT_NEAR(g.acceptance(0, 0.95f, false), 0.95, 1e-9);  // the prior: the bin's centre
  EXPECT_NEAR(g.acceptance(0, -1.0f, false), 0.5, 1e-9);   // no score: 1/2
  const float hi = 0.97f, lo = 0.12f;
  for (int i = 0; i < 400; ++i) {
    // A confident draft right 3 times in 5 (the head is over-confident), an unsure one never.
    g.observe_acceptance(1, i % 5 < 3 ? 1 : 0, &hi, false);
    g.observe_acceptance(1, 0, &lo, false);
  }
  EXPECT_NEAR(g.acceptance(0, hi, false), 0.6, 0.03);
  EXPECT_LT(g.acceptance(0, lo, false), 0.02);
  EXPECT_NEAR(g.acceptance(0, 0.91f, false), g.acceptance(0, hi, false), 1e-12);  // same bin
  EXPECT_NEAR(g.acceptance(0, hi, true), 0.95, 1e-9);                             // sampled: not seen yet
  EXPECT_NEAR(g.acceptance(1, hi, false), 0.95, 1e-9);                            // position 1: never reached
  EXPECT_NEAR(g.mean_acceptance(0, false), 0.3, 0.03);
  // A second draft is counted only where the first was accepted.
  const float both[2] = {hi, hi};
  for (int i = 0; i < 100; ++i) g.observe_acceptance(2, 0, both, false);
  EXPECT_NEAR(g.acceptance(1, hi, false), 0.95, 1e-9);
  for (int i = 0; i < 100; ++i) g.observe_acceptance(2, 2, both, false);
  EXPECT_GT(g.acceptance(1, hi, false), 0.95);
}

// Two drafts scored 0.97 and 0.12 with acceptances learned as above.
struct Calibrated {
  SpecGate g;
  Calibrated(Mode mode, bool padded) : g(1, mode, padded) {
    const float hi = 0.97f, lo = 0.12f;
    for (int i = 0; i < 400; ++i) {
      g.observe_acceptance(1, 1, &hi, false);
      g.observe_acceptance(1, 0, &lo, false);
    }
    // Batch 8: a plain step 1 ms, one verified draft per sequence 1.3 ms (37.5 us a draft row).
    feed(g, 8, 0, 1.0e-3);
    feed(g, 8, 1, 1.3e-3);
  }
};

// Four sequences hold a confident draft, four an unsure one.
std::vector<DraftScores> mixed_step() {
  static const float hi = 0.97f, lo = 0.12f;
  std::vector<DraftScores> s;
  for (int i = 0; i < 8; ++i) s.push_back({1, i % 2 == 0 ? &hi : &lo, false});
  return s;
}

// Ragged rows (an eager backend): the confident drafts are verified, the unsure ones are not: each of
// those adds a draft row's cost (1/8 of 0.3 ms) for ~1 % of a token, below the step's tokens per
// second; the confident ones add ~0.99 of a token for the same.
TEST(SpecGate, ConfidenceVerifiesOnlyTheLikelyDrafts) {
  Calibrated c(Mode::kConfidence, false);
  std::vector<int> admit;
  EXPECT_EQ(c.g.plan(8, mixed_step(), admit), 1);
  EXPECT_EQ(admit, (std::vector<int>{1, 0, 1, 0, 1, 0, 1, 0}));
  // "cost" sees every draft at the mean (~1/2): all or nothing; here all, 8 + 4 tokens in 1.3 ms beat 8 in 1.
  Calibrated cost(Mode::kCost, false);
  EXPECT_EQ(cost.g.plan(8, mixed_step(), admit), 1);
  EXPECT_EQ(admit, std::vector<int>(8, 1));
  // All unsure: plain decode, no MTP pass.
  static const float lo = 0.12f;
  EXPECT_EQ(c.g.plan(8, std::vector<DraftScores>(8, DraftScores{1, &lo, false}), admit), 0);
  EXPECT_EQ(admit, std::vector<int>(8, 0));
}

// A padded backend (graphs) computes every sequence's rows at the step's depth: once one draft is
// worth it, every draft at that depth is verified (its rows are paid for anyway).
TEST(SpecGate, PaddedVerifiesEveryDraftUpToTheDepth) {
  Calibrated c(Mode::kConfidence, true);
  std::vector<int> admit;
  EXPECT_EQ(c.g.plan(8, mixed_step(), admit), 1);
  EXPECT_EQ(admit, std::vector<int>(8, 1));
  static const float lo = 0.12f;
  EXPECT_EQ(c.g.plan(8, std::vector<DraftScores>(8, DraftScores{1, &lo, false}), admit), 0);
}

// Sequences that hold no drafts yet (after plain steps, or just prefilled) are planned at their
// position's mean: the step speculates (runs the MTP pass that proposes) where the steady state pays,
// verifying nothing this step.
TEST(SpecGate, PlansDraftsNotYetProposedAtTheMean) {
  SpecGate g(1, Mode::kConfidence, false);
  accept(g, 1, 1, 200);
  feed(g, 4, 0, 1.0e-3);
  feed(g, 4, 1, 1.2e-3);
  std::vector<int> admit;
  EXPECT_EQ(g.plan(4, std::vector<DraftScores>(4, DraftScores{}), admit), 1);
  EXPECT_EQ(admit, std::vector<int>(4, 0));
  // Verifying costs 3x: plain.
  feed(g, 4, 1, 3.0e-3, 40);
  EXPECT_EQ(g.plan(4, std::vector<DraftScores>(4, DraftScores{}), admit), 0);
}

// A step of prompt chunks only has no decode to plan: it keeps the last decode step's regime, so a
// prompt gets its MTP pass while speculation pays (and none while it does not).
TEST(SpecGate, PromptOnlyStepsKeepTheLastRegime) {
  SpecGate g(2, Mode::kConfidence, false);
  std::vector<int> admit;
  EXPECT_EQ(g.plan(4, {}, admit), 2);  // nothing decided yet: speculation gets its chance
  accept(g, 2, 2, 200);
  feed(g, 4, 0, 1.0e-3);
  feed(g, 4, 1, 1.1e-3);
  feed(g, 4, 2, 1.2e-3);
  EXPECT_EQ(g.plan(4, std::vector<DraftScores>(4, DraftScores{}), admit), 2);
  EXPECT_EQ(g.plan(4, {}, admit), 2);
  feed(g, 4, 1, 4.0e-3, 40);  // (below 4x the old costs: not dropped as stalls)
  feed(g, 4, 2, 4.5e-3, 40);
  EXPECT_EQ(g.plan(4, std::vector<DraftScores>(4, DraftScores{}), admit), 0);
  EXPECT_EQ(g.plan(4, {}, admit), 0);
  EXPECT_TRUE(admit.empty());
}

TEST(SpecGate, FixedAdmitsWhatEachSequenceHolds) {
  SpecGate g(3, Mode::kFixed, true);
  std::vector<int> admit;
  EXPECT_EQ(g.plan(3, {{3, nullptr, false}, {1, nullptr, true}, {0, nullptr, false}}, admit), 3);
  EXPECT_EQ(admit, (std::vector<int>{3, 1, 0}));
}

}  // namespace
}  // namespace beluga
