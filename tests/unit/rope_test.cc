// Rotary tables: YaRN correction range and frequencies, llama3 scaling, against values worked out by
// hand from the formulas in DESIGN.md §4 (and the DeepSeek reference numbers low=10, high=23).
#include <gtest/gtest.h>

#include <cmath>

#include "model/rope.h"

namespace beluga {
namespace {

ModelConfig yarn_config(double mscale, double mscale_all) {
  ModelConfig c;
  c.rope_theta = 10000;
  c.max_position_embeddings = 163840;
  c.rope.type = RopeScaling::Type::kYarn;
  c.rope.factor = 40;
  c.rope.original_max_position_embeddings = 4096;
  c.rope.beta_fast = 32;
  c.rope.beta_slow = 1;
  c.rope.mscale = mscale;
  c.rope.mscale_all_dim = mscale_all;
  return c;
}

TEST(Rope, YarnCorrectionRangeForDeepSeek) {
  YarnRange r = yarn_correction_range(32, 1, 64, 10000, 4096);
  EXPECT_EQ(r.low, 10);
  EXPECT_EQ(r.high, 23);
}

TEST(Rope, YarnFrequenciesBlendBetweenLowAndHigh) {
  float af = 0;
  auto inv = rope_inv_freq(yarn_config(1.0, 1.0), 64, &af);
  ASSERT_EQ(inv.size(), 32u);
  EXPECT_FLOAT_EQ(af, 1.0f);  // mscale == mscale_all_dim: cos/sin unscaled
  for (int i = 0; i < 32; ++i) {
    const double base = 1.0 / std::pow(10000.0, 2.0 * i / 64);
    const double ramp = std::clamp((i - 10.0) / 13.0, 0.0, 1.0);
    const double expect = base / 40 * ramp + base * (1 - ramp);
    EXPECT_NEAR(inv[i], expect, 1e-6 * expect) << i;
  }
  EXPECT_NEAR(inv[5], 1.0 / std::pow(10000.0, 10.0 / 64), 1e-7);        // i <= low: unscaled
  EXPECT_NEAR(inv[30], 1.0 / std::pow(10000.0, 60.0 / 64) / 40, 1e-9);  // i >= high: divided by factor
}

TEST(Rope, YarnAttentionFactorWhenMscalesDiffer) {
  float af = 0;
  rope_inv_freq(yarn_config(1.0, 0.5), 64, &af);
  const double m1 = 0.1 * 1.0 * std::log(40.0) + 1, m2 = 0.1 * 0.5 * std::log(40.0) + 1;
  EXPECT_NEAR(af, m1 / m2, 1e-6);
}

TEST(Rope, Llama3Scaling) {
  ModelConfig c;
  c.rope_theta = 500000;
  c.rope.type = RopeScaling::Type::kLlama3;
  c.rope.factor = 8;
  c.rope.low_freq_factor = 1;
  c.rope.high_freq_factor = 4;
  c.rope.original_max_position_embeddings = 8192;
  float af = 0;
  auto inv = rope_inv_freq(c, 128, &af);
  for (int i = 0; i < 64; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / 128), wl = 2 * M_PI / f;
    double expect = f;
    if (wl > 8192)
      expect = f / 8;
    else if (wl >= 2048) {
      const double s = (8192 / wl - 1) / 3;
      expect = (1 - s) * f / 8 + s * f;
    }
    EXPECT_NEAR(inv[i], expect, 2e-6 * expect) << i;
  }
}

TEST(Rope, TablesAreCosSinOfPositionTimesFrequency) {
  ModelConfig c;
  c.rope_theta = 10000;
  std::vector<float> cs, sn;
  rope_tables(c, 8, 100, &cs, &sn);
  ASSERT_EQ(cs.size(), 400u);
  EXPECT_FLOAT_EQ(cs[0], 1.0f);
  EXPECT_FLOAT_EQ(sn[0], 0.0f);
  EXPECT_NEAR(cs[size_t(77) * 4 + 1], std::cos(77 * std::pow(10000.0, -0.25)), 2e-5);
  EXPECT_NEAR(sn[size_t(77) * 4 + 3], std::sin(77 * std::pow(10000.0, -0.75)), 2e-5);
}

}  // namespace
}  // namespace beluga
