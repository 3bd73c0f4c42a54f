// The few-row product (decode GEMV) as a block-level device function, shared by the GEMV kernels
// (cuda_linear.cu) and kernels that run it beside other work in one launch (cuda_kv_cache.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

// Few-row products (decode): one warp per output unit streams its weight row with 16-byte loads past
// L1 and dots it with each of the M <= kGemvRows activation rows, which every warp of the SM shares
// through L1. cuBLAS at M = 1..4 reaches about a third of the bandwidth on these shapes.
constexpr int kGemvRows = 4, kGemvThreads = 256;
// Rows this short take the 32-lane GEMV whatever the output width (few warps have little to stream).
constexpr int kGemvShortK = 512;
// Whether an [N, K] product of up to kGemvRows rows takes the GEMV rather than cuBLAS (gemm_bf16), and
// so whether norm_linear may fold its norm in (the same bits). Narrow outputs (a MoE router: N = 64)
// leave too few warps to hide the loads, where cuBLAS splits K; short rows on 32 lanes (128 < K <=
// kGemvShortK) have little to hide. Narrower lane groups stay on cuBLAS: the demo model's q_b (N 192,
// K 128, 16 lanes) ran 3.9-4.3 us on the GEMV against 3.5 on cuBLAS (H100 runs 353, 355).
inline bool gemv_shape(int N, int K) {
  return N >= 256 || (K <= kGemvShortK && K / 8 > 16);
}

__device__ __forceinline__ void store_out(float* p, float v) {
  *p = v;
}
__device__ __forceinline__ void store_out(bf16* p, float v) {
  *p = __float2bfloat16(v);
}

// blockIdx.y selects a head (linear_heads): x, w and out advance by their head strides.
struct HeadStrides {
  int64_t x, w, out;
};

// kLanes lanes share one output unit: 32 for long rows; 16 or 8 when a row is only K8 <= kLanes
// 16-byte chunks (the absorbed MLA's W_UK, K = 128), so no lane idles.
// Block (bx, head) of the product; a kernel calls it as its whole body (gemv_kernel) or for some
// of its blocks (a horizontally fused launch).
// kLdg: x is read-only global memory for the whole kernel (read through the non-coherent path); else
// plain loads, as for rows the kernel put in shared memory.
template <typename OutT, int kLanes, bool kLdg = true>
__device__ __forceinline__ void gemv_block(OutT* out, int64_t ldo, const bf16* x, int64_t ldx, const bf16* w,
                                           int64_t ldw, int M, int N, int K8, HeadStrides hs, int bx,
                                           int head) {
  const int sub = threadIdx.x % kLanes;
  const int u = (bx * kGemvThreads + threadIdx.x) / kLanes;
  const bool ok = u < N;  // lanes of one warp may differ when kLanes < 32: all stay for the shuffles
  const bf16* wr = w + head * hs.w + int64_t(u) * ldw;
  if (kLanes == 32 && !ok) return;
  out += head * hs.out;
  x += head * hs.x;
  float acc[kGemvRows] = {};
  constexpr int U = 4;  // 16-byte loads in flight per lane (8 measured slower)
  for (int k0 = sub; k0 < K8; k0 += kLanes * U) {
    uint4 wv[U];
#pragma unroll
    for (int j = 0; j < U; ++j)
      wv[j] = ok && k0 + kLanes * j < K8 ? ld_stream(wr + (k0 + kLanes * j) * 8) : uint4{};
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int k8 = k0 + kLanes * j;
      if (k8 >= K8) break;
#pragma unroll
      for (int r = 0; r < kGemvRows; ++r)
        if (r < M) {
          const uint4* xr = reinterpret_cast<const uint4*>(x + r * ldx) + k8;
          acc[r] += dot8(wv[j], kLdg ? __ldg(xr) : *xr);
        }
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvRows; ++r) {
    if (r >= M) break;
    float v = acc[r];
#pragma unroll
    for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (sub == 0 && ok) store_out(out + r * ldo + u, v);
  }
}

// A GEMV whose M <= kRows input rows [M, K] each block builds in shared memory itself: fill(xs)
// writes them (ending with a barrier) while the unit's first weights load, then gemv_block's products
// run on them (32 lanes per unit, same order: same bits as the 32-lane gemv_kernel). Returns warp
// unit u = (blockIdx.x * kGemvThreads + threadIdx.x) / 32's sums (every lane holds them; units past
// N sum zeros). kRows: the rows a block holds (1, or kGemvRows): one row needs fewer registers.
// The kernel launches kGemvThreads threads with M * K * 2 bytes of dynamic shared memory.
template <int kRows>
struct GemvSums {
  float v[kRows];
};

template <int kRows, typename Fill>
__device__ __forceinline__ GemvSums<kRows> smem_gemv(const bf16* w, int64_t ldw, int M, int N, int K,
                                                     Fill fill) {
  extern __shared__ __align__(16) unsigned char gemv_smem[];
  bf16* xs = reinterpret_cast<bf16*>(gemv_smem);  // [M, K]
  const int lane = threadIdx.x & 31, K8 = K / 8;
  const int u = (blockIdx.x * kGemvThreads + threadIdx.x) / 32;
  const bool ok = u < N;
  const bf16* wr = w + int64_t(u) * ldw;
  pdl_entry();
  // Before the fill: the first round of the unit's weights into registers (one row: registers to
  // spare) and the rest of its row into L2 (128-byte lines), so the prologue runs under the loads'
  // latency.
  constexpr int U = 4, kEarly = kRows == 1 ? U : 0;
  uint4 first[U];
#pragma unroll
  for (int j = 0; j < kEarly; ++j)
    first[j] = ok && lane + 32 * j < K8 ? ld_stream_early(wr + (lane + 32 * j) * 8) : uint4{};
  if (ok)
    for (int l = 4 * kEarly + lane; l < K8 / 8; l += 32)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(wr + l * 64));
  fill(xs);
  GemvSums<kRows> acc{};
  for (int k0 = lane; k0 < K8; k0 += 32 * U) {
    uint4 wv[U];
#pragma unroll
    for (int j = 0; j < U; ++j)
      wv[j] = kEarly && k0 == lane     ? first[j]
              : ok && k0 + 32 * j < K8 ? ld_stream(wr + (k0 + 32 * j) * 8)
                                       : uint4{};
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int k8 = k0 + 32 * j;
      if (k8 >= K8) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < M) acc.v[r] += dot8(wv[j], reinterpret_cast<const uint4*>(xs + r * K)[k8]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (r < M) acc.v[r] = warp_sum(acc.v[r]);
  return acc;
}

// smem_gemv's sums stored as out [M, N] (lane 0 of each unit's warp).
template <typename OutT, int kRows>
__device__ __forceinline__ void store_gemv_sums(OutT* out, int64_t ldo, const GemvSums<kRows>& y, int M,
                                                int N) {
  const int u = (blockIdx.x * kGemvThreads + threadIdx.x) / 32;
  if ((threadIdx.x & 31) != 0 || u >= N) return;
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    if (r < M) store_out(out + r * ldo + u, y.v[r]);
}

// Lanes per output unit for rows of K8 16-byte chunks: the narrowest group that covers a row.
inline int gemv_lanes(int64_t K8) {
  return K8 <= 8 ? 8 : K8 <= 16 ? 16 : 32;
}

// Whether per-head products x [T, H, K] . w[h]^T (w the BF16 [H, N, K]) take the GEMV blocks: few
// tokens, rows in 16-byte chunks.
inline bool heads_gemv_ok(const Tensor& x, const Tensor& w) {
  return x.shape[0] <= kGemvRows && x.shape[2] % 8 == 0 && x.stride[0] % 8 == 0 && x.stride[1] % 8 == 0 &&
         w.stride[0] % 8 == 0 && w.stride[1] % 8 == 0 && aligned16(x.data) && aligned16(w.data);
}

}  // namespace beluga::cuda
