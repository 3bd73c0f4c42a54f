// The DeepSeek-V4 step kernels' view of a step (ops.h: v4_compress, v4_indexer_topk,
// v4_sink_attention): each row finds its sequence, position and block table from the step's device
// arrays, so a decode step's launches read nothing the host prepared for that step alone and can be
// recorded once as a graph.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

struct V4Step {
  const int32_t* query_start;  // [num_seqs + 1]
  const int32_t* block_table;  // [num_seqs, max_blocks]
  const int32_t* positions;    // [T]
  const int32_t* slots;        // [T]: < 0 for a graph's padding rows (they write nothing)
  int num_seqs, max_blocks;
};

inline V4Step v4_step(const AttnMeta& m) {
  return {m.query_start, m.block_table, m.positions, m.slot_mapping, m.num_seqs, m.max_blocks};
}

// Row t's block table (its sequence's) and position.
struct V4Row {
  const int32_t* table;
  int pos;
};
__device__ __forceinline__ V4Row v4_row(const V4Step& s, int t) {
  const int q = seq_of_token(s.query_start, s.num_seqs, t);
  return {s.block_table + int64_t(q) * s.max_blocks, s.positions[t]};
}

// Cache rows (flat [blocks * rows per block, width] views) of token p and of entry e at `rate`.
__device__ __forceinline__ int64_t v4_token_row(const int32_t* table, int p) {
  return int64_t(table[p >> 6]) * 64 + (p & 63);
}
__device__ __forceinline__ int64_t v4_entry_row(const int32_t* table, int e, int rate, int per_block) {
  return int64_t(table[((e + 1) * rate - 1) >> 6]) * per_block + e % per_block;
}

}  // namespace beluga::cuda
