// Sampling on the device: one token per logit row from the CPU sampler's parameters (temperature,
// top_k, top_p, min_p, the seeded draw, logit bias, repetition / presence / frequency penalties) and a
// token bitmask (structured outputs, min_tokens' stop ids), so a step copies token ids back instead of
// [rows, vocab] floats, with the token's logprob and rank and up to kMaxTopLogprobs top logprobs.
// Rows that want top logprobs and edit their logits stay on the host sampler (engine/sampler.h).
// Graph-capturable: everything a row needs is read from device memory. Semantics (engine/sampler.h's, in its
// order): the row's logit edits (below) change the logits they name; the mask sets disallowed logits to -inf;
// temperature <= 0 takes the argmax (ties: the lowest id; bit-identical to the host); otherwise probabilities
// exp((x - max) / T), top_k, min_p and top_p keep a prefix of the descending order (ties: the lower id) and
// the row's uniform u picks the token where u * kept mass falls, walking that order (in id order when no
// filter is set), as the host does. Masses are 2^-40 fixed point on the device (deterministic sums; a token
// below 2^-40 of the top one is never drawn), so a boundary token can differ from the host's double-precision
// walk by rounding. The logprob and rank are the raw (unedited, unmasked) distribution's, as on the host.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "tensor/tensor.h"

namespace beluga {

// One row's parameters, as the device reads them (I32 [R, kSampleRowWords] tensors of these).
struct DeviceSampleRow {
  float temperature = 0;  // <= 0: greedy
  float top_p = 1;        // >= 1: off
  float min_p = 0;        // <= 0: off
  int32_t top_k = 0;      // <= 0 or >= vocab: off
  double u = 0;           // the step's uniform in [0, 1) (sample_uniform(), the CPU sampler's)
  int32_t mask_row = -1;  // row of the bitmask tensor (bit id%32 of word id/32; set = allowed); -1: none
  int32_t logprob = 0;    // 1: also the token's logprob and rank in the raw (unmasked) distribution
  // The row's logit edits: DeviceLogitEdit entries [edit_begin, edit_begin + edit_count), one per
  // token, with the penalties they take.
  int32_t edit_begin = 0, edit_count = 0;
  float repetition_penalty = 1, presence_penalty = 0, frequency_penalty = 0;
  // With logprob: the raw distribution's best top_logprobs (<= kMaxTopLogprobs) tokens too, best
  // first (ties: the lower id). Not with edits (the host takes such rows).
  int32_t top_logprobs = 0;
  int32_t unused[2] = {0, 0};
};
constexpr int kSampleRowWords = 16;
static_assert(sizeof(DeviceSampleRow) == 4 * kSampleRowWords, "the device reads rows of 16 words");

// One token's edit, in the host sampler's order: x += bias (kEditBias); then, in the repetition set
// (prompt and output tokens, kEditRepeated), x = x > 0 ? x / repetition_penalty : x *
// repetition_penalty; then, generated count > 0 times, x -= presence + frequency * count.
struct DeviceLogitEdit {
  int32_t token = 0;
  float bias = 0;
  int32_t count = 0;
  uint32_t flags = 0;
};
constexpr uint32_t kEditBias = 1, kEditRepeated = 2;
static_assert(sizeof(DeviceLogitEdit) == 16, "the device reads edits of 4 words");

// A row's edit for a token the step before it is still sampling (the engine's early launch): once
// the runner knows that token (the previous step's logit row `future_row`), it counts one more output
// of it among sample row `row`'s edits (the entry after the row's edits is kept free for it).
struct PendingEdit {
  int32_t row, future_row;
};

// Columns of sample_rows' output per row: token id, logprob (F32 bits), rank (1-based), the number of
// top entries, then kMaxTopLogprobs (id, logprob bits) pairs.
constexpr int kMaxTopLogprobs = 20;
constexpr int kSampleOutCols = 4 + 2 * kMaxTopLogprobs;

// One step's device sampling as the host prepares it: a row per logit row, and the masks they name.
struct DeviceSampling {
  std::vector<DeviceSampleRow> rows;
  std::vector<uint32_t> masks;  // [M, ceil(vocab / 32)]
  std::vector<DeviceLogitEdit> edits;
  std::vector<PendingEdit> pending;
  void clear() {
    rows.clear();
    masks.clear();
    edits.clear();
    pending.clear();
  }
  // Counts the pending edits' tokens (ids[future_row] each); false when an id is missing.
  bool resolve_pending(const std::vector<int32_t>& ids);
};

// sample_rows' edits: the entries (I32 [E, 4] of DeviceLogitEdit), and device scratch the sampler
// writes (raw: F32 [>= E], the edited logits' raw values; lse: F32 [>= R], the raw log-sum-exp of rows
// with edits and a logprob). Empty when no row has edits.
struct SampleEdits {
  Tensor edits, raw, lse;
};

inline bool DeviceSampling::resolve_pending(const std::vector<int32_t>& ids) {
  for (const PendingEdit& pe : pending) {
    if (pe.future_row < 0 || size_t(pe.future_row) >= ids.size()) return false;
    const int32_t t = ids[size_t(pe.future_row)];
    DeviceSampleRow& r = rows[size_t(pe.row)];
    DeviceLogitEdit* e = edits.data() + r.edit_begin;
    // The row's edits are sorted by token (device_sample_row); this runs between two forwards.
    DeviceLogitEdit* it = std::lower_bound(e, e + r.edit_count, t,
                                           [](const DeviceLogitEdit& a, int32_t v) { return a.token < v; });
    if (it == e + r.edit_count || it->token != t) {  // the free entry after the row's edits
      it = e + r.edit_count++;
      *it = DeviceLogitEdit{t, 0.0f, 0, 0u};
    }
    it->count++;
    if (r.repetition_penalty != 1.0f) it->flags |= kEditRepeated;
  }
  pending.clear();
  return true;
}

class SampleRowsOp {
 public:
  virtual ~SampleRowsOp() = default;
  // out I32 [R, kSampleOutCols]; logits F32 [R, V] (row stride >= V; rows with edits are edited in
  // place); rows I32 [>= R, kSampleRowWords] of DeviceSampleRow; masks I32 [M, ceil(V / 32)] (may be
  // empty when no row names one); edits as above. Enqueued in stream order with the backend's other ops.
  virtual void sample_rows(Tensor out, const Tensor& logits, const Tensor& rows, const Tensor& masks,
                           const SampleEdits& edits = {}) = 0;
};

}  // namespace beluga
