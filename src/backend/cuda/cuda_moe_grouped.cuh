// The grouped expert kernels' common ground: their arguments (a planned launch over all experts) and
// which tile of which expert a block computes. The kernels: mma.sync tiles of token rows in cuda_moe.cu,
// wgmma tiles of token rows in cuda_moe_wgmma.cu, wgmma tiles of weight rows with the tokens as the
// narrow side in cuda_moe_swap.cu.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

struct GroupedArgs {
  const bf16* a;
  int64_t lda;
  const int* row_token;  // gate-up: A row r is token row_token[r]; down: A row r is row r
  const void* const* ptrs;
  const int* inter;
  const int* start;
  const int* tile_start;
  int ne, D;     // ne: experts in the table (its stride), the shared one last
  int ne_tiles;  // the first ne_tiles experts have tiles here (ne, or the routed ones alone)
  void* out;     // gate-up: H, BF16 [R, I]; down: Y, [R, D] in F32 (y_f32) or BF16
  int64_t ldo;
  bool y_f32;
  float swiglu_limit;  // > 0: the gate-up epilogue clamps (swiglu())
};

// The down projection's output element i (and i + 1) in Y's type.
__device__ __forceinline__ void store_y(const GroupedArgs& p, int64_t i, float v) {
  if (p.y_f32)
    static_cast<float*>(p.out)[i] = v;
  else
    static_cast<bf16*>(p.out)[i] = __float2bfloat16(v);
}
__device__ __forceinline__ void store_y2(const GroupedArgs& p, int64_t i, float v0, float v1) {
  if (p.y_f32)
    *reinterpret_cast<float2*>(static_cast<float*>(p.out) + i) = make_float2(v0, v1);
  else
    *reinterpret_cast<uint32_t*>(static_cast<bf16*>(p.out) + i) = pack_bf16(v0, v1);
}

// Block (x, y)'s work in a grouped launch: tile y of the planned rows (rows [m0, m_end) of one expert,
// m_end the expert's end) against output columns from n0 = x * cols (gate-up: hidden units; down: D), with
// K the reduction length and w0 / w1 the gate / up (or down) weights. False past the last tile or past
// the expert's output width.
struct ExpertTile {
  int m0, m_end, K, Nout, n0;
  const bf16* w0;
  const bf16* w1;
};
template <bool kGateUp>
__device__ __forceinline__ bool expert_tile(const GroupedArgs& p, int bm, int cols, ExpertTile& t) {
  const int tile = blockIdx.y;
  if (tile >= p.tile_start[p.ne_tiles]) return false;
  int lo = 0, hi = p.ne_tiles - 1;  // the largest e with tile_start[e] <= tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.tile_start[mid] <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  t.m0 = p.start[lo] + (tile - p.tile_start[lo]) * bm;
  t.m_end = p.start[lo + 1];
  const int I = p.inter[lo];
  t.K = kGateUp ? p.D : I;
  t.Nout = kGateUp ? I : p.D;
  t.n0 = blockIdx.x * cols;
  if (t.n0 >= t.Nout) return false;
  t.w0 = static_cast<const bf16*>(p.ptrs[(kGateUp ? 0 : 2) * p.ne + lo]);
  t.w1 = kGateUp ? static_cast<const bf16*>(p.ptrs[p.ne + lo]) : nullptr;
  return true;
}

// Tiles of 128 weight rows (gate-up: 64 hidden units; down: 128 output columns) against up to
// kSwapTileRows of an expert's token rows (the plan's tile), the wgmma N side 16 or 32 as the rows present
// (cuda_moe_swap.cu).
constexpr int kSwapTileRows = 32;
void launch_swap_tiles(bool gate_up, const GroupedArgs& a, int grid_y, cudaStream_t st);

// Tiles of kWgTileRows token rows against 256 weight rows (gate-up: 128 hidden units; down: 256 output
// columns) on wgmma (cuda_moe_wgmma.cu); cols: the gate-up's widest expert (hidden units) or the down's D.
constexpr int kWgTileRows = 128;
void launch_wgmma_tiles(bool gate_up, const GroupedArgs& a, int cols, int grid_y, cudaStream_t st);

}  // namespace beluga::cuda
