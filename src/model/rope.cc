#include "model/rope.h"

#include <algorithm>
#include <cmath>

namespace beluga {

YarnRange yarn_correction_range(double beta_fast, double beta_slow, int dim, double base,
                                int original_max_pos) {
  auto corr = [&](double rot) {
    return dim * std::log(original_max_pos / (rot * 2 * M_PI)) / (2 * std::log(base));
  };
  double low = std::floor(corr(beta_fast)), high = std::ceil(corr(beta_slow));
  return {std::max(low, 0.0), std::min(high, double(dim - 1))};
}

double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

std::vector<float> rope_inv_freq(const ModelConfig& c, int dim, float* attention_factor) {
  const int half = dim / 2;
  const float base = float(c.rope_theta);
  std::vector<float> inv(half);
  // float32 as torch computes `1 / base ** (arange(0, dim, 2) / dim)`.
  for (int i = 0; i < half; ++i) inv[i] = 1.0f / std::pow(base, float(2 * i) / float(dim));
  *attention_factor = 1.0f;
  const RopeScaling& r = c.rope;
  switch (r.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLinear:
      for (auto& f : inv) f /= float(r.factor);
      break;
    case RopeScaling::Type::kYarn: {
      const int orig = r.original_max_position_embeddings > 0 ? r.original_max_position_embeddings
                                                              : c.max_position_embeddings;
      YarnRange yr = yarn_correction_range(r.beta_fast, r.beta_slow, dim, c.rope_theta, orig);
      double lo = yr.low, hi = yr.high;
      if (lo == hi) hi += 0.001;
      for (int i = 0; i < half; ++i) {
        float ramp = std::clamp(float((i - lo) / (hi - lo)), 0.0f, 1.0f);
        float extrap = 1.0f - ramp;  // weight of the unscaled frequency
        float interp_f = inv[i] / float(r.factor);
        inv[i] = interp_f * (1.0f - extrap) + inv[i] * extrap;
      }
      if (r.mscale_all_dim > 0)
        *attention_factor =
            float(yarn_get_mscale(r.factor, r.mscale) / yarn_get_mscale(r.factor, r.mscale_all_dim));
      else
        *attention_factor = float(yarn_get_mscale(r.factor, 1.0));
      if (r.attention_factor > 0) *attention_factor = float(r.attention_factor);
      break;
    }
    case RopeScaling::Type::kLlama3: {
      const double old_ctx = r.original_max_position_embeddings;
      const double low_wl = old_ctx / r.low_freq_factor, high_wl = old_ctx / r.high_freq_factor;
      for (auto& f : inv) {
        const double wl = 2 * M_PI / f;
        if (wl > low_wl) {
          f = float(f / r.factor);
        } else if (wl >= high_wl) {
          const double smooth = (old_ctx / wl - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
          f = float((1 - smooth) * f / r.factor + smooth * f);
        }
      }
      break;
    }
  }
  return inv;
}

void rope_tables(const ModelConfig& c, int dim, int max_positions, std::vector<float>* cos_out,
                 std::vector<float>* sin_out) {
  float af = 1.0f;
  const std::vector<float> inv = rope_inv_freq(c, dim, &af);
  const int half = dim / 2;
  cos_out->resize(size_t(max_positions) * half);
  sin_out->resize(size_t(max_positions) * half);
  for (int p = 0; p < max_positions; ++p)
    for (int i = 0; i < half; ++i) {
      const float angle = float(p) * inv[i];  // float32 product, as torch's matmul of positions and inv_freq
      (*cos_out)[size_t(p) * half + i] = float(std::cos(double(angle))) * af;
      (*sin_out)[size_t(p) * half + i] = float(std::sin(double(angle))) * af;
    }
}

}  // namespace beluga
