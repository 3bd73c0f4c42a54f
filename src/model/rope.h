// Rotary embedding tables: base frequencies, YaRN and llama3 scaling, as Hugging Face computes them
// (float32 inverse frequencies; cos/sin scaled by the yarn attention factor).
#pragma once

#include <vector>

#include "loader/model_config.h"

namespace beluga {

struct YarnRange {
  double low, high;
};
// The dims whose wavelength crosses beta_fast/beta_slow rotations over the original context.
YarnRange yarn_correction_range(double beta_fast, double beta_slow, int dim, double base,
                                int original_max_pos);
double yarn_get_mscale(double scale, double mscale);

// Inverse frequencies [dim/2] after the config's rope scaling, and the cos/sin magnitude factor.
std::vector<float> rope_inv_freq(const ModelConfig& c, int dim, float* attention_factor);

// cos and sin tables [max_positions, dim/2] for the config's scaling.
void rope_tables(const ModelConfig& c, int dim, int max_positions, std::vector<float>* cos_out,
                 std::vector<float>* sin_out);

}  // namespace beluga
