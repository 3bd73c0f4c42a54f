// Sampling on the device: one token per logit row from the CPU sampler's history-free parameters
// (temperature, top_k, top_p, min_p, the seeded draw) and a token bitmask (structured outputs,
// min_tokens' stop ids), so a step copies token ids back instead of [rows, vocab] floats. Rows that
// need a sequence's history or more output (penalties, logit bias, top logprobs) stay on the host
// sampler (engine/sampler.h). Graph-capturable: everything a row needs is read from device memory.
// Semantics (engine/sampler.h's, in its order): the mask sets disallowed logits to -inf; temperature
// <= 0 takes the argmax (ties: the lowest id; bit-identical to the host); otherwise probabilities
// exp((x - max) / T), top_k, min_p and top_p keep a prefix of the descending order (ties: the lower
// id) and the row's uniform u picks the token where u * kept mass falls, walking that order (in id
// order when no filter is set), as the host does. Masses are 2^-40 fixed point on the device
// (deterministic sums; a token below 2^-40 of the top one is never drawn), so a boundary token can
// differ from the host's double-precision walk by rounding.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace beluga {

// One row's parameters, as the device reads them (I32 [R, 8] tensors of these).
struct DeviceSampleRow {
  float temperature = 0;  // <= 0: greedy
  float top_p = 1;        // >= 1: off
  float min_p = 0;        // <= 0: off
  int32_t top_k = 0;      // <= 0 or >= vocab: off
  double u = 0;           // the step's uniform in [0, 1) (sample_uniform(), the CPU sampler's)
  int32_t mask_row = -1;  // row of the bitmask tensor (bit id%32 of word id/32; set = allowed); -1: none
  int32_t logprob = 0;    // 1: also the token's logprob and rank in the raw (unmasked) distribution
};
static_assert(sizeof(DeviceSampleRow) == 32, "the device reads rows of 8 words");

// Columns of sample_rows' output per row: token id, logprob (F32 bits), rank (1-based), unused.
constexpr int kSampleOutCols = 4;

// One step's device sampling as the host prepares it: a row per logit row, and the masks they name.
struct DeviceSampling {
  std::vector<DeviceSampleRow> rows;
  std::vector<uint32_t> masks;  // [M, ceil(vocab / 32)]
  void clear() {
    rows.clear();
    masks.clear();
  }
};

class SampleRowsOp {
 public:
  virtual ~SampleRowsOp() = default;
  // out I32 [R, kSampleOutCols]; logits F32 [R, V] (row stride >= V); rows I32 [>= R, 8] of
  // DeviceSampleRow; masks I32 [M, ceil(V / 32)] (may be empty when no row names one). Enqueued in
  // stream order with the backend's other ops.
  virtual void sample_rows(Tensor out, const Tensor& logits, const Tensor& rows, const Tensor& masks) = 0;
};

}  // namespace beluga
