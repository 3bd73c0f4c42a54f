// RMSNorm on the GPU in one summation order for every kernel, alone (rmsnorm_kernel) or folded into
// the kernel that consumes the normalized rows (Ops::NormedInput: norm_linear, norm_moe_gate).
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

constexpr int kNormThreads = 256;  // the block size of every kernel that normalizes

struct NormArgs {
  const bf16* residual;
  int64_t ldr;
  const bf16* delta;  // null: nothing to add
  int64_t ldd;
  bf16* res_out;  // residual + delta (may be residual: in place); unused without a delta
  int64_t ldro;
  VecRef w;
  float eps;
  bf16* out;  // the normalized rows
  int64_t ldo;
  int D;
};

// Eight BF16 sums a + b, each rounded to BF16 (as add_rmsnorm stores the residual).
__device__ __forceinline__ uint4 add8(uint4 a, uint4 b) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* y = reinterpret_cast<const __nv_bfloat162*>(&b);
  uint4 r;
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fx = __bfloat1622float2(x[i]), fy = __bfloat1622float2(y[i]);
    o[i] = __floats2bfloat162_rn(fx.x + fy.x, fx.y + fy.y);
  }
  return r;
}

__device__ __forceinline__ float sumsq8(uint4 v, float ss) {
  const __nv_bfloat162* x = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(x[i]);
    ss = fmaf(f.x, f.x, ss);
    ss = fmaf(f.y, f.y, ss);
  }
  return ss;
}

// Eight values of a norm weight (F32 or BF16) from d0 (a multiple of 8; 16-byte aligned vectors).
__device__ __forceinline__ void load_w8(VecRef w, int d0, float (&wf)[8]) {
  if (w.f32) {
    const float4 a = __ldg(static_cast<const float4*>(w.p) + d0 / 4),
                 b = __ldg(static_cast<const float4*>(w.p) + d0 / 4 + 1);
    wf[0] = a.x, wf[1] = a.y, wf[2] = a.z, wf[3] = a.w, wf[4] = b.x, wf[5] = b.y, wf[6] = b.z, wf[7] = b.w;
  } else {
    const uint4 q = __ldg(static_cast<const uint4*>(w.p) + d0 / 8);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&q);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      wf[2 * i] = f.x, wf[2 * i + 1] = f.y;
    }
  }
}

// The one RMSNorm order every kernel uses, so fused and unfused paths give the same bits: thread t
// of kNormThreads takes the 16-byte chunks t, t + kNormThreads, ... of a row and sums the squares of
// its values in order; warp sums, then the warps' sums in order. Rows row0 .. row0 + M - 1 (M <=
// kMaxM) go together: one round trip loads a chunk of every row, its delta and the weights.
// Pass 1 stores residual + delta to `sum` rows (with a delta; may be the residual rows themselves:
// a thread rewrites only chunks it has read), pass 2 the normalized rows to `dst` (may be `sum`).
// With `copy`, the residual_out and out rows of n get the same values (a fused kernel's block 0, whose
// sum/dst rows are in shared memory). Needs D % 8 == 0 and 16-byte aligned rows; ends with a barrier.
template <int kMaxM>
__device__ __forceinline__ void block_rmsnorm_rows(const NormArgs& n, int row0, int M, bf16* sum, int64_t lds,
                                                   bf16* dst, int64_t ldd, bool copy) {
  __shared__ float red[kMaxM][kNormThreads / 32];
  const int C = n.D / 8, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float ss[kMaxM] = {};
  for (int c = threadIdx.x; c < C; c += kNormThreads) {
    uint4 v[kMaxM], e[kMaxM];
#pragma unroll
    for (int r = 0; r < kMaxM; ++r) {
      if (r >= M) break;
      v[r] = reinterpret_cast<const uint4*>(n.residual + int64_t(row0 + r) * n.ldr)[c];
      if (n.delta) e[r] = reinterpret_cast<const uint4*>(n.delta + int64_t(row0 + r) * n.ldd)[c];
    }
    // Pass 2's weights: into L1 while the rows load.
    asm volatile(
        "prefetch.global.L1 [%0];" ::"l"(static_cast<const char*>(n.w.p) + int64_t(c) * (n.w.f32 ? 32 : 16)));
#pragma unroll
    for (int r = 0; r < kMaxM; ++r) {
      if (r >= M) break;
      if (n.delta) {
        v[r] = add8(v[r], e[r]);
        reinterpret_cast<uint4*>(sum + r * lds)[c] = v[r];
        if (copy) reinterpret_cast<uint4*>(n.res_out + int64_t(row0 + r) * n.ldro)[c] = v[r];
      }
      ss[r] = sumsq8(v[r], ss[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kMaxM; ++r) {
    if (r >= M) break;
    const float t = warp_sum(ss[r]);
    if (lane == 0) red[r][warp] = t;
  }
  __syncthreads();
  float inv[kMaxM];
#pragma unroll
  for (int r = 0; r < kMaxM; ++r) {
    if (r >= M) break;
    float t = 0;
#pragma unroll
    for (int w = 0; w < kNormThreads / 32; ++w) t += red[r][w];
    inv[r] = rsqrtf(t / float(n.D) + n.eps);
  }
  for (int c = threadIdx.x; c < C; c += kNormThreads) {
    float wf[8];
    load_w8(n.w, c * 8, wf);
#pragma unroll
    for (int r = 0; r < kMaxM; ++r) {
      if (r >= M) break;
      const uint4 x = n.delta ? reinterpret_cast<const uint4*>(sum + r * lds)[c]
                              : reinterpret_cast<const uint4*>(n.residual + int64_t(row0 + r) * n.ldr)[c];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
      uint4 o;
      __nv_bfloat162* q = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        q[i] = __floats2bfloat162_rn(wf[2 * i] * (f.x * inv[r]), wf[2 * i + 1] * (f.y * inv[r]));
      }
      reinterpret_cast<uint4*>(dst + r * ldd)[c] = o;
      if (copy) reinterpret_cast<uint4*>(n.out + int64_t(row0 + r) * n.ldo)[c] = o;
    }
  }
  __syncthreads();
}

// The sum of squares of one row in block_rmsnorm_rows' order (vectorized: D % 8 == 0, 16-byte
// aligned; else rmsnorm_kernel's element-strided order), for kernels that normalize a row their own
// way. Every thread of a kNormThreads block calls it and gets the sum.
__device__ __forceinline__ float block_row_sumsq(const bf16* row, int D, bool vectorized,
                                                 float* red /* [33] */) {
  float ss = 0;
  if (vectorized) {
    for (int c = threadIdx.x; c < D / 8; c += kNormThreads)
      ss = sumsq8(reinterpret_cast<const uint4*>(row)[c], ss);
  } else {
    for (int d = threadIdx.x; d < D; d += kNormThreads) {
      const float f = to_f(row[d]);
      ss = fmaf(f, f, ss);
    }
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  ss = warp_sum(ss);
  __syncthreads();
  if (lane == 0) red[warp] = ss;
  __syncthreads();
  float t = 0;
#pragma unroll
  for (int w = 0; w < kNormThreads / 32; ++w) t += red[w];
  return t;
}

// The device view of `in` (the sum goes to residual_out, or in place when that is empty).
inline NormArgs make_norm_args(const NormedInput& in) {
  const bool add = !in.delta.empty();
  const Tensor& ro = in.residual_out.empty() ? in.residual : in.residual_out;
  return NormArgs{in.residual.ptr<const bf16>(),
                  in.residual.stride[0],
                  add ? in.delta.ptr<const bf16>() : nullptr,
                  add ? in.delta.stride[0] : 0,
                  add ? static_cast<bf16*>(ro.data) : nullptr,
                  add ? ro.stride[0] : 0,
                  vec(in.w),
                  in.eps,
                  in.out.ptr<bf16>(),
                  in.out.stride[0],
                  int(in.out.shape[1])};
}

// The device view of `in`, or false where the fused kernels do not apply (dtypes, strides,
// alignment, an in-place residual update that other blocks could still be reading): then the
// caller composes the ops.
inline bool norm_args(const NormedInput& in, NormArgs* a) {
  auto rows = [](const Tensor& t) {
    return t.dtype == DType::kBF16 && t.ndim == 2 && t.stride[1] == 1 && t.stride[0] % 8 == 0 &&
           aligned16(t.data);
  };
  const bool has_delta = !in.delta.empty();
  const Tensor& ro = in.residual_out;
  if (!rows(in.residual) || !rows(in.out) || (in.w.dtype != DType::kF32 && in.w.dtype != DType::kBF16) ||
      !aligned16(in.w.data) || in.out.shape != in.residual.shape || in.w.numel() != in.out.shape[1] ||
      in.out.shape[1] % 8 != 0 || in.out.data == in.residual.data)
    return false;
  if (has_delta && (!rows(in.delta) || in.delta.shape != in.residual.shape || ro.empty() || !rows(ro) ||
                    ro.shape != in.residual.shape || ro.data == in.residual.data ||
                    ro.data == in.delta.data || ro.data == in.out.data || in.out.data == in.delta.data))
    return false;
  *a = make_norm_args(in);
  return true;
}

}  // namespace beluga::cuda
