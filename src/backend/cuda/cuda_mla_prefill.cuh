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
  int heads;
  // Query blocks with more than split_min key tiles run as two blocks over half the tiles each; the one
  // that finishes second merges the other's partial (part: F32, prefill_part_floats) and writes the rows.
  // counters: [num_seqs, heads, max_split] zeros, left zero. PrefillSplit says how many.
  int split_min, max_split;
  float* part;
  int* counters;
};

// How run_mla_prefill_wgmma spreads a prefill's blocks: blocks per (sequence, head) (`items`: query blocks
// plus one per split), the split threshold in 64-key tiles (INT_MAX: none) and the most split query
// blocks of a sequence. Chosen by simulating the in-order block dispatch on `sms` SMs for a few
// thresholds (bench/NOTES.md runs 81, 84: at a 2K prompt the SMs were 55 % active behind the longest blocks).
struct PrefillSplit {
  int items, split_min, max_split;
};
PrefillSplit plan_prefill_split(const AttnMeta& m, int H, int sms, int max_counters);
int64_t prefill_part_floats(const PrefillSplit& p, int H, int num_seqs);

// The Hopper (wgmma) kernel: 192 queries per block (three warpgroups of 64) against 64-key tiles, split
// as `split` says (a.split_min, a.max_split are set from it).
void run_mla_prefill_wgmma(const PrefillArgs& a, const PrefillSplit& split, int num_seqs, cudaStream_t st);

}  // namespace beluga::cuda
