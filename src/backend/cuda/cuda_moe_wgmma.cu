// The experts' grouped products on Hopper warpgroup MMAs (wgmma) in tiles of kWgTileRows token rows,
// over the plan's rows (cuda_moe_grouped.cuh): gate-up with SiLU-and-mul into H, or down into Y.
// A block: 128 rows (two warpgroups of 64) x 256 weight rows (gate-up: 128 hidden units as [gate 16 |
// up 16] x 8, so each thread holds a unit's gate and up; down: 256 output columns), K in 64-element
// stages (one 128-byte swizzled row per tile row; cuda_wgmma.cuh), 4 stages of 48 KB, one block per SM.
// All 8 warps load with cp.async; each warpgroup multiplies its 64 x 256 (4 wgmma per stage) while two
// later stages land. The mma.sync tiles (cuda_moe.cu) ran the 2K prefill's experts at ~170-190 TFLOP/s with
// the tensor pipe half idle (ncu: 4 warps per scheduler, 13 cycles between issues; bench/NOTES.md run 54).
// Measured against 128-column tiles (2 blocks per SM) and 3 stages ahead without the overlap: both
// slower (2K prefill 29.5 ms against 30.9 and 31.0; run 56).
// An expert's last tile with at most 64 rows (at a 2K prefill on V2-Lite about half of the experts end
// in one) puts both warpgroups on those rows, each against 128 of the weight rows: prefill 512 13.6 ->
// 13.1 ms, 2K 29.7 -> 28.7 (run 70).
#include <type_traits>

#include "backend/cuda/cuda_kernel_config.h"
#include "backend/cuda/cuda_moe_grouped.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

namespace beluga::cuda {

namespace {

constexpr int kWgBN = 256, kWgBK = 64, kWgStages = 4, kWgThreads = 256;
constexpr int kWgATile = kWgTileRows * kWgBK * 2, kWgBTile = kWgBN * kWgBK * 2;
constexpr int kWgSmem = kWgStages * (kWgATile + kWgBTile) + 1024;  // + aligning the tiles to 1024 bytes

template <bool kGateUp>
__global__ void __launch_bounds__(kWgThreads, 1) grouped_wgmma_kernel(GroupedArgs p) {
  pdl_entry();
  extern __shared__ unsigned char smem_raw[];
  ExpertTile t;
  if (!expert_tile<kGateUp>(p, kWgTileRows, kGateUp ? kWgBN / 2 : kWgBN, t)) return;
  const int m0 = t.m0, m_end = t.m_end, K = t.K, Nout = t.Nout, n0 = t.n0;
  // An expert's last tile with at most 64 rows: both warpgroups take those rows, each against half of
  // the weight rows (m64n128), instead of one warpgroup multiplying padding.
  const bool narrow = m_end - m0 <= 64;
  const bf16 *w0 = t.w0, *w1 = t.w1;
  const auto [sA, sB, gA, gB] = swizzled_regions(smem_raw, kWgStages * kWgATile);

  // Thread t copies 16-byte chunk t % 8 of tile rows t / 8 + 32 i: the same rows and chunk at every K
  // step, so the row pointers are computed once; all its rows share r % 8, so one swizzled offset.
  const int tid = threadIdx.x, c8 = tid & 7, r8 = tid >> 3;
  constexpr int kAChunks = kWgTileRows / 32, kBChunks = kWgBN / 32;
  const uint32_t off = sw128_offset(r8, c8);
  const bf16* a_src[kAChunks];
  const bf16* b_src[kBChunks];
  bool a_ok[kAChunks], b_ok[kBChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int r = m0 + r8 + 32 * i;
    a_ok[i] = r < m_end;
    a_src[i] = a_ok[i] ? p.a + (kGateUp ? int64_t(p.row_token[r]) : int64_t(r)) * p.lda + c8 * 8 : p.a;
  }
#pragma unroll
  for (int i = 0; i < kBChunks; ++i) {
    int idx;
    const bf16* base = w0;
    if (kGateUp) {  // tile row 32 i + r8: group i, gate for r8 < 16, up for r8 >= 16
      idx = n0 + i * 16 + (r8 & 15);
      base = r8 < 16 ? w0 : w1;
    } else {
      idx = n0 + 32 * i + r8;
    }
    b_ok[i] = idx < Nout;
    b_src[i] = b_ok[i] ? base + int64_t(idx) * K + c8 * 8 : w0;
  }
  const int KT = (K + kWgBK - 1) / kWgBK;
  auto load = [&](int stage, int kt, auto narrow_tag) {
    const int k0 = kt * kWgBK;
    const bool k_ok = k0 + c8 * 8 < K;
    unsigned char* as = gA + stage * kWgATile + off;
    unsigned char* bs = gB + stage * kWgBTile + off;
#pragma unroll
    for (int i = 0; i < (decltype(narrow_tag)::value ? kAChunks / 2 : kAChunks); ++i) {  // narrow: 64 rows
      const bool ok = a_ok[i] && k_ok;
      cp_async16(as + i * 32 * 128, ok ? a_src[i] + k0 : p.a, ok);
    }
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      const bool ok = b_ok[i] && k_ok;
      cp_async16(bs + i * 32 * 128, ok ? b_src[i] + k0 : w0, ok);
    }
  };

  // Two stages in flight ahead of the one multiplied, and one stage's wgmma running across the barrier:
  // the buffer loaded at kt is the one read at kt - 2, which every warpgroup has waited for. A narrow
  // tile runs its own copy of the loop and epilogue (kNarrow), so the full tiles' code stays as it was.
  constexpr int kAhead = kWgStages - 2;
  const int wg = tid >> 7;
  auto run = [&](auto narrow_tag) {
    constexpr bool kNarrow = decltype(narrow_tag)::value;
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < KT) load(s, s, narrow_tag);
      cp_async_commit();
    }
    float acc[kNarrow ? kWgBN / 4 : kWgBN / 2];
#pragma unroll
    for (int i = 0; i < int(sizeof(acc) / sizeof(float)); ++i) acc[i] = 0.0f;
    for (int kt = 0; kt < KT; ++kt) {
      cp_async_wait<kAhead - 1>();  // this thread's chunks of stage kt
      fence_async_shared();
      __syncthreads();  // everyone's chunks of kt; no warpgroup reads the buffer loaded next
      if (kt + kAhead < KT) load((kt + kAhead) % kWgStages, kt + kAhead, narrow_tag);
      cp_async_commit();
      const int st = kt % kWgStages;
      // Narrow: rows 0 .. 63 against weight rows wg * 128 .. + 127 (m64n128); else rows wg * 64 .. + 63
      // against all 256 (m64n256).
      const uint64_t da = sw128_desc(sA + st * kWgATile + (kNarrow ? 0 : wg * 64 * 128));
      const uint64_t db = sw128_desc(sB + st * kWgBTile + (kNarrow ? wg * 128 * 128 : 0));
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kWgBK / 16; ++kk) wgmma_ss(acc, da + 2 * kk, db + 2 * kk);
      wgmma_commit();
      wgmma_wait<1>();  // stage kt - 1's products are done
    }
    wgmma_wait<0>();
    cp_async_wait<0>();

    // Accumulator column group j (8 weight rows) is the tile's column group j + jofs.
    constexpr int kJ = kNarrow ? kWgBN / 16 : kWgBN / 8;
    const int jofs = kNarrow ? wg * kJ : 0;
    const int lane = tid & 31, g = lane >> 2, t4 = lane & 3;
    const int row0 = m0 + (kNarrow ? 0 : wg * 64) + ((tid >> 5) & 3) * 16 + g;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = row0 + half * 8;
      if (r >= m_end) continue;
      if (kGateUp) {
        bf16* o = static_cast<bf16*>(p.out) + int64_t(r) * p.ldo;
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          if ((j & 3) >= 2) continue;  // up tiles: read with their gate tile j - 2 (jofs % 4 == 0)
          const int unit = n0 + ((j + jofs) >> 2) * 16 + (j & 1) * 8 + 2 * t4;
          const float g0 = acc[4 * j + 2 * half], g1 = acc[4 * j + 2 * half + 1];
          const float u0 = acc[4 * (j + 2) + 2 * half], u1 = acc[4 * (j + 2) + 2 * half + 1];
          if (unit < Nout)
            *reinterpret_cast<uint32_t*>(o + unit) =
                pack_bf16(swiglu(g0, u0, p.swiglu_limit), swiglu(g1, u1, p.swiglu_limit));
        }
      } else {
#pragma unroll
        for (int j = 0; j < kJ; ++j) {
          const int col = n0 + 8 * (j + jofs) + 2 * t4;
          if (col < Nout)
            store_y2(p, int64_t(r) * p.ldo + col, acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
        }
      }
    }
  };
  if (narrow)
    run(std::true_type{});
  else
    run(std::false_type{});
}

// cols: the gate-up's widest expert (hidden units) or the down's D.
template <bool G>
void launch_wgmma(const GroupedArgs& a, int cols, int grid_y, cudaStream_t st) {
  const int grid_x = int(ceil_div(cols, G ? kWgBN / 2 : kWgBN));
  launch(grouped_wgmma_kernel<G>, dim3(grid_x, grid_y), kWgThreads, kWgSmem, st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace

void configure_wgmma_kernels() {
  for (auto k : {grouped_wgmma_kernel<true>, grouped_wgmma_kernel<false>}) allow_dynamic_smem(k, kWgSmem);
}

void launch_wgmma_tiles(bool gate_up, const GroupedArgs& a, int cols, int grid_y, cudaStream_t st) {
  if (gate_up)
    launch_wgmma<true>(a, cols, grid_y, st);
  else
    launch_wgmma<false>(a, cols, grid_y, st);
}

}  // namespace beluga::cuda
