// MLA prefill attention (expanded form: 192-wide q/k with a shared 64-wide rope part, 128-wide v),
// causal over a cached prefix + new chunk, several sequences: the kernels' arguments and launcher
// (cuda_mla_prefill.cu).
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

constexpr int kPrefillDk = 192, kPrefillNope = 128, kPrefillDv = 128;

struct PrefillArgs {
  const bf16* q;  // [T, H, 192] (strides q0, q1)
  int64_t q0, q1;
  const bf16* kv;  // [C, H, 128 nope | 128 v] (strides kv0, kv1)
  int64_t kv0, kv1;
  const bf16* kpe;  // [C, 64] (stride kpe0), shared by the heads
  int64_t kpe0;
  bf16* out;  // [T, H, 128] (strides o0, o1)
  int64_t o0, o1;
  const int32_t* qs;   // query_start [S + 1]
  const int32_t* ctx;  // context_len [S]
  float scale_log2;
  // wgmma kernel: v transposed per head, [H, 128, ldvt] with each sequence's keys from a 64-aligned
  // offset (sum of the earlier sequences' key counts rounded up to 64), zeros past its keys.
  bf16* vt;
  int64_t ldvt;
};

// Keys of all sequences rounded up to 64 each: the row length of PrefillArgs::vt.
int64_t prefill_vt_len(const AttnMeta& m);

// The Hopper (wgmma) kernel: transposes v into a.vt, then 192 queries per block (three warpgroups of
// 64) against 64-key tiles. max_q / max_keys: the longest chunk / the most keys of a sequence.
void run_mla_prefill_wgmma(const PrefillArgs& a, int max_q, int max_keys, int H, int num_seqs,
                           cudaStream_t st);

}  // namespace beluga::cuda
