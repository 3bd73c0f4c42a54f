#include "engine/host_sample_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/sampler.h"

namespace beluga {

void HostSampleRows::sample_rows(Tensor out, const Tensor& logits, const Tensor& rows, const Tensor& masks,
                                 const SampleEdits& edits) {
  const int R = int(logits.shape[0]), V = int(logits.shape[1]);
  const int words = (V + 31) / 32;
  row_.resize(size_t(V));
  for (int r = 0; r < R; ++r) {
    const DeviceSampleRow& p = rows.ptr<const DeviceSampleRow>()[r];
    const float* raw = logits.ptr<const float>() + int64_t(r) * logits.stride[0];
    // The edits and the mask go on a copy (the logprob and rank are the raw distribution's); a row
    // with neither draws from the raw logits as they are.
    const float* x = raw;
    if (p.edit_count > 0 || p.mask_row >= 0) {
      std::copy_n(raw, V, row_.data());
      x = row_.data();
    }
    if (p.edit_count > 0) {  // per token in sample()'s order: bias, repetition, counts
      const auto* e = edits.edits.ptr<const DeviceLogitEdit>() + p.edit_begin;
      const bool counts = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
      for (int j = 0; j < p.edit_count; ++j) {
        const int t = e[j].token;
        if (t < 0 || t >= V) continue;
        float v = row_[size_t(t)];
        if (e[j].flags & kEditBias) v += e[j].bias;
        if (e[j].flags & kEditRepeated) v = v > 0 ? v / p.repetition_penalty : v * p.repetition_penalty;
        if (counts && e[j].count > 0) v -= p.presence_penalty + p.frequency_penalty * float(e[j].count);
        row_[size_t(t)] = v;
      }
    }
    if (p.mask_row >= 0) {
      const auto* m = masks.ptr<const uint32_t>() + int64_t(p.mask_row) * words;
      for (int t = 0; t < V; ++t)
        if (!((m[t >> 5] >> (t & 31)) & 1)) row_[size_t(t)] = -INFINITY;
    }
    const int token = sample_row(x, V, p, index_);
    int32_t* o = out.ptr<int32_t>() + int64_t(r) * kSampleOutCols;
    o[0] = token;
    o[1] = o[2] = o[3] = 0;
    if (!p.logprob) continue;
    const TokenLogprob lp =
        token_logprob(raw, V, token, std::min(p.top_logprobs, kMaxTopLogprobs), scratch_, index_);
    std::memcpy(&o[1], &lp.logprob, 4);
    o[2] = lp.rank;
    o[3] = int32_t(lp.top.size());
    for (size_t j = 0; j < lp.top.size(); ++j) {
      o[4 + 2 * j] = lp.top[j].first;
      std::memcpy(&o[5 + 2 * j], &lp.top[j].second, 4);
    }
  }
}

}  // namespace beluga
