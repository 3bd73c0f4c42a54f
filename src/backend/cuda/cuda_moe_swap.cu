// Expert tiles with the roles of a GEMM swapped, for decode batches: 128 weight rows are the wgmma M side
// and up to 32 of an expert's token rows the N side (16 or 32 wide, as the rows present). At a few rows
// per expert the token-row tiles (cuda_moe_wgmma.cu) spend their products and shared-memory reads on padding
// rows; here a block's work is little more than its weight stream (5 stages, two blocks per SM). Wider
// tiles on this layout (up to 256 tokens in pieces of 128 / 64 / 32 / 16 columns) lost to the
// 128-token-row tiles from 48 rows per expert (bench/NOTES.md run 67).
#include "backend/cuda/cuda_kernel_config.h"
#include "backend/cuda/cuda_moe_grouped.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace beluga::cuda {

namespace {

constexpr int kSwM = 128, kSwN = kSwapTileRows, kSwBK = 64, kSwStages = 5, kSwThreads = 256;
constexpr int kSwATile = kSwM * kSwBK * 2, kSwBTile = kSwN * kSwBK * 2;  // rows of 128 bytes per stage
constexpr int kSwSmem = kSwStages * (kSwATile + kSwBTile) + 1024;        // + aligning the tiles to 1 KB

// One warpgroup's accumulators: a tile of 17 to 32 rows takes one m64n32 product per K step, a tile of
// up to 16 rows one m64n16 (half the token side's shared-memory reads).
struct SwapAcc {
  float d32[16], d16[8];

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < 16; ++i) d32[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) d16[i] = 0.0f;
  }
  template <class F>
  __device__ __forceinline__ void apply(bool wide, F&& f) {
    if (wide)
      f(d32);
    else
      f(d16);
  }
};

// A block: 128 weight rows (two warpgroups of 64; gate-up: 64 hidden units as [gate 8 | up 8] x 8, so a
// thread's accumulator rows g and g + 8 are one unit's gate and up; down: 128 output columns) against
// one tile's token rows, K in 64-element stages written by cp.async into the 128-byte swizzle, 5 stages:
// three ahead and one stage's wgmma in flight across the barrier (as grouped_wgmma_kernel), two blocks
// per SM, so 96 KB of weights in flight per SM.
template <bool kGateUp>
__global__ void __launch_bounds__(kSwThreads, 2) grouped_swap_kernel(GroupedArgs p) {
  pdl_entry();
  extern __shared__ unsigned char smem_raw[];
  ExpertTile t;
  if (!expert_tile<kGateUp>(p, kSwN, kGateUp ? kSwM / 2 : kSwM, t)) return;
  const int m0 = t.m0, n_tok = min(t.m_end - m0, kSwN), K = t.K, Nout = t.Nout, n0 = t.n0;
  const bool wide = n_tok > 16;
  const bf16 *w0 = t.w0, *w1 = t.w1;
  const auto [sA, sB, gA, gB] = swizzled_regions(smem_raw, kSwStages * kSwATile);

  // Thread t copies 16-byte chunk t % 8 of weight rows t / 8 + 32 i and of token row t / 8: the same
  // rows at every K step, so their pointers are computed once, and one swizzled offset serves them all.
  const int tid = threadIdx.x, c8 = tid & 7, r8 = tid >> 3;
  constexpr int kAChunks = kSwM / 32;
  const uint32_t off = sw128_offset(r8, c8);
  const bf16* a_src[kAChunks];
  bool a_ok[kAChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int rr = r8 + 32 * i;
    int idx;
    const bf16* base = w0;
    if (kGateUp) {  // group rr / 16: gate rows for rr % 16 < 8, then up rows of the same 8 units
      idx = n0 + (rr >> 4) * 8 + (rr & 7);
      base = (rr & 8) ? w1 : w0;
    } else {
      idx = n0 + rr;
    }
    a_ok[i] = idx < Nout;
    a_src[i] = a_ok[i] ? base + int64_t(idx) * K + c8 * 8 : w0;
  }
  // Token rows n_tok .. 15 (or 31) are zeros; rows 16 .. 31 of a narrow tile are never read.
  const bool b_ok = r8 < n_tok, b_load = r8 < (wide ? 32 : 16);
  const bf16* const b_src =
      b_ok ? p.a + (kGateUp ? int64_t(p.row_token[m0 + r8]) : int64_t(m0 + r8)) * p.lda + c8 * 8 : p.a;
  const int KT = (K + kSwBK - 1) / kSwBK;
  auto load = [&](int stage, int kt) {
    const int k0 = kt * kSwBK;
    const bool k_ok = k0 + c8 * 8 < K;
    unsigned char* as = gA + stage * kSwATile + off;
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const bool ok = a_ok[i] && k_ok;
      cp_async16(as + i * 32 * 128, ok ? a_src[i] + k0 : w0, ok);
    }
    if (b_load) cp_async16(gB + stage * kSwBTile + off, b_ok && k_ok ? b_src + k0 : p.a, b_ok && k_ok);
  };

  SwapAcc acc;
  acc.zero();
  constexpr int kAhead = kSwStages - 2;
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  const int wg = tid >> 7;
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kAhead - 1>();  // this thread's chunks of stage kt
    fence_async_shared();
    __syncthreads();  // everyone's chunks of kt; no warpgroup reads the buffer loaded next
    if (kt + kAhead < KT) load((kt + kAhead) % kSwStages, kt + kAhead);
    cp_async_commit();
    const int st = kt % kSwStages;
    const uint64_t da = sw128_desc(sA + st * kSwATile + wg * 64 * 128);
    const uint64_t db = sw128_desc(sB + st * kSwBTile);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kSwBK / 16; ++kk)
      acc.apply(wide, [&](auto& d) { wgmma_ss(d, da + 2 * kk, db + 2 * kk); });
    wgmma_commit();
    wgmma_wait<1>();  // stage kt - 1's products are done
  }
  wgmma_wait<0>();
  cp_async_wait<0>();

  // Accumulator d[4j + q] is weight row w16 + g, d[4j + 2 + q] row w16 + g + 8, both at token column
  // 8j + 2t + q (warp w of the warpgroup, g = lane / 4, t = lane % 4).
  const int lane = tid & 31, g = lane >> 2, t4 = lane & 3, w = (tid >> 5) & 3;
  // Gate-up: this thread's unit (rows g: gate, g + 8: up); down: its output columns col and col + 8.
  const int unit = n0 + wg * 32 + w * 8 + g, col = n0 + wg * 64 + w * 16 + g;
  const bool ok0 = kGateUp ? unit < Nout : col < Nout, ok1 = !kGateUp && col + 8 < Nout;
  acc.apply(wide, [&](auto& d) {
    constexpr int J = int(sizeof(d) / sizeof(float)) / 4;
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int q = 0; q < 2; ++q) {
        const int tok = 8 * j + 2 * t4 + q;
        if (tok >= n_tok) continue;
        const int64_t row = int64_t(m0 + tok) * p.ldo;
        const float v0 = d[4 * j + q], v1 = d[4 * j + 2 + q];
        if (kGateUp) {
          if (ok0) static_cast<bf16*>(p.out)[row + unit] = __float2bfloat16(swiglu(v0, v1, p.swiglu_limit));
        } else {
          if (ok0) store_y(p, row + col, v0);
          if (ok1) store_y(p, row + col + 8, v1);
        }
      }
  });
}

template <bool G>
void launch_swap(const GroupedArgs& a, int grid_y, cudaStream_t st) {
  const int grid_x = int(G ? ceil_div(a.ldo, kSwM / 2) : ceil_div(a.D, kSwM));  // ldo: the widest expert
  launch(grouped_swap_kernel<G>, dim3(grid_x, grid_y), kSwThreads, kSwSmem, st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace

void configure_swap_kernels() {
  for (auto k : {grouped_swap_kernel<true>, grouped_swap_kernel<false>}) allow_dynamic_smem(k, kSwSmem);
}

void launch_swap_tiles(bool gate_up, const GroupedArgs& a, int grid_y, cudaStream_t st) {
  if (gate_up)
    launch_swap<true>(a, grid_y, st);
  else
    launch_swap<false>(a, grid_y, st);
}

}  // namespace beluga::cuda
