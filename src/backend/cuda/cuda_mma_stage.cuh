// One shared-memory stage of a warp's tile product on mma.sync m16n8k16 (BF16 in, F32 accumulate): the
// warp's MT x 16 rows of A against its NT x 8 rows of B (both K-contiguous in shared memory, kLd
// elements apart), k16 steps in ascending order; and the multistage cp.async loop around it. The grouped
// expert tiles (cuda_moe.cu) and the batch-invariant GEMM (cuda_gemm_invariant.cu) run their K loops on them:
// each accumulator element is one chain of k16 steps whatever the tile around it.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

template <int MT, int NT, int kBK, int kLd>
__device__ __forceinline__ void mma_stage(float (&acc)[MT][NT][4], const bf16* as, int a_row0, const bf16* bs,
                                          int b_row0, int lane) {
  static_assert(NT % 2 == 0, "B fragments come in pairs of n8 tiles (one ldmatrix.x4)");
#pragma unroll
  for (int k16 = 0; k16 < kBK / 16; ++k16) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldsm_x4(af[mt], as + (a_row0 + mt * 16 + (lane & 15)) * kLd + k16 * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
      uint32_t bfr[4];
      ldsm_x4(bfr, bs + (b_row0 + np * 16 + (lane & 7) + (lane >> 4) * 8) * kLd + k16 * 16 +
                       ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma_bf16(acc[mt][2 * np], af[mt], bfr[0], bfr[1]);
        mma_bf16(acc[mt][2 * np + 1], af[mt], bfr[2], bfr[3]);
      }
    }
  }
}

// The K loop of a kStages-deep cp.async pipeline over KT stages: load(buffer, kt) issues stage kt's
// copies into a buffer, compute(buffer) consumes the stage waiting there; kStages - 1 stages stay in
// flight ahead of the one computed. Ends with every copy landed.
template <int kStages, class Load, class Compute>
__device__ __forceinline__ void cp_async_pipeline(int KT, Load&& load, Compute&& compute) {
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int nk = kt + kStages - 1;
    if (nk < KT) load(nk % kStages, nk);
    cp_async_commit();
    compute(kt % kStages);
  }
  cp_async_wait<0>();
}

}  // namespace beluga::cuda
