// The batch-invariant GEMM of `--deterministic` on CUDA: out[z][M, N] = x[z][M, K] . w[z][N, K]^T for
// z < batch (heads), BF16 in, F32 accumulate, F32 or BF16 out. Each output element is one warp's chain
// of mma.sync m16n8k16 steps over K in ascending order from zero (no split over K, not across warps
// nor blocks), so its bits depend on its own row and column only: tile sizes, chosen by M for speed,
// change how many elements a block computes, never how one is summed. cuBLAS and our GEMV pick
// algorithms and reduction splits by shape, so a row's bits there depend on the rows beside it.
// Needs K % 8 == 0, row and batch strides of x and w multiples of 8 elements, x and w 16-byte aligned
// (invariant_gemm_ok); the caller copies a view that is not.
#pragma once

#include <cstdint>

namespace beluga::cuda {

struct InvariantGemm {
  void* out = nullptr;
  bool out_f32 = false;
  int64_t ldo = 0, out_z = 0;
  const void* x = nullptr;  // BF16
  int64_t ldx = 0, x_z = 0;
  const void* w = nullptr;  // BF16
  int64_t ldw = 0, w_z = 0;
  int M = 0, N = 0, K = 0, batch = 1;
};

bool invariant_gemm_ok(const InvariantGemm& g);
void invariant_gemm(const InvariantGemm& g, void* stream);

}  // namespace beluga::cuda
