// DeepSeek-V4's manifold-constrained hyper-connections on the GPU (ops.h states the contracts):
// the mixing weights (sigmoid gates and the Sinkhorn-normalized stream mix, one thread per token:
// n <= 8 streams, so a token's n x n matrix fits in registers and its 2 n Sinkhorn sweeps are a few
// hundred flops), and the collapse / expand of the n residual streams (element-wise, F32 sums of
// BF16 streams). The Sinkhorn sums run in F64 as the CPU backend's do, so the two agree to rounding.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kMaxStreams = 8;

__device__ __forceinline__ float sigmoid_f(float x) {
  return 1.0f / (1.0f + expf(-x));
}

__global__ void hc_weights_kernel(float* pre, int64_t ldp, float* post, int64_t ldq, float* comb, int64_t ldc,
                                  const float* mix, int64_t ldm, const float* base, const float* scale, int T,
                                  int n, int iters, float eps) {
  pdl_entry();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* z = mix + int64_t(t) * ldm;
  for (int i = 0; i < n; ++i) pre[int64_t(t) * ldp + i] = sigmoid_f(z[i] * scale[0] + base[i]) + eps;
  if (!post) return;
  for (int i = 0; i < n; ++i)
    post[int64_t(t) * ldq + i] = 2.0f * sigmoid_f(z[n + i] * scale[1] + base[n + i]);
  double c[kMaxStreams * kMaxStreams];
  for (int r = 0; r < n; ++r) {  // row-wise softmax + eps
    const float* zr = z + 2 * n + r * n;
    const float* br = base + 2 * n + r * n;
    double mx = -INFINITY;
    for (int k = 0; k < n; ++k) mx = fmax(mx, double(zr[k] * scale[2] + br[k]));
    double sum = 0;
    for (int k = 0; k < n; ++k) sum += (c[r * n + k] = exp(double(zr[k] * scale[2] + br[k]) - mx));
    for (int k = 0; k < n; ++k) c[r * n + k] = c[r * n + k] / sum + eps;
  }
  for (int it = 0; it < iters; ++it) {  // Sinkhorn: columns, then (rows, columns) iters - 1 times
    if (it > 0)
      for (int r = 0; r < n; ++r) {
        double s = 0;
        for (int k = 0; k < n; ++k) s += c[r * n + k];
        for (int k = 0; k < n; ++k) c[r * n + k] /= s + eps;
      }
    for (int k = 0; k < n; ++k) {
      double s = 0;
      for (int r = 0; r < n; ++r) s += c[r * n + k];
      for (int r = 0; r < n; ++r) c[r * n + k] /= s + eps;
    }
  }
  for (int i = 0; i < n * n; ++i) comb[int64_t(t) * ldc + i] = float(c[i]);
}

__global__ void hc_collapse_kernel(bf16* out, int64_t ldo, const bf16* s, int64_t lds, const float* pre,
                                   int64_t ldp, int T, int n, int D) {
  pdl_entry();
  const int64_t total = int64_t(T) * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    float acc = 0;
    for (int j = 0; j < n; ++j) acc += pre[t * ldp + j] * to_f(s[t * lds + int64_t(j) * D + d]);
    out[t * ldo + d] = __float2bfloat16(acc);
  }
}

__global__ void hc_expand_kernel(bf16* out, int64_t ldo, const bf16* s, int64_t lds, const float* post,
                                 int64_t ldq, const float* comb, int64_t ldc, const bf16* y, int64_t ldy,
                                 int T, int n, int D) {
  pdl_entry();
  const int64_t total = int64_t(T) * n * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / (int64_t(n) * D), k = (i / D) % n, d = i % D;
    float acc = post[t * ldq + k] * to_f(y[t * ldy + d]);
    for (int j = 0; j < n; ++j) acc += comb[t * ldc + j * n + k] * to_f(s[t * lds + int64_t(j) * D + d]);
    out[t * ldo + k * D + d] = __float2bfloat16(acc);
  }
}

void check_f32_rows(const Tensor& t, const char* what) {
  BELUGA_CHECK(t.dtype == DType::kF32 && t.ndim == 2 && t.stride[1] == 1, what,
               " must be an F32 [rows, cols] matrix with unit column stride, got ", t.describe());
}

}  // namespace

void CudaOps::hc_weights(Tensor pre, Tensor post, Tensor comb, const Tensor& mix, const Tensor& base,
                         const Tensor& scale, int iters, float eps) {
  Prof prof_scope(this, "hc_weights");
  const int T = int(mix.shape[0]), n = int(pre.shape[1]);
  const bool head_only = post.empty();
  check_f32_rows(mix, "hc_weights mix");
  check_f32_rows(pre, "hc_weights pre");
  BELUGA_CHECK(base.dtype == DType::kF32 && scale.dtype == DType::kF32 && base.is_contiguous() &&
                   scale.is_contiguous() && n >= 1 && n <= kMaxStreams && pre.shape[0] == T &&
                   mix.shape[1] == (head_only ? n : (2 + n) * n) && base.numel() == mix.shape[1] &&
                   scale.numel() == (head_only ? 1 : 3) && iters >= 1,
               "hc_weights: shapes");
  if (!head_only) {
    check_f32_rows(post, "hc_weights post");
    BELUGA_CHECK(comb.dtype == DType::kF32 && comb.stride[comb.ndim - 1] == 1 &&
                     comb.numel() == int64_t(T) * n * n &&
                     (comb.ndim == 2 ? comb.shape[1] == n * n : comb.stride[1] == n),
                 "hc_weights: comb must be F32 [T, n * n]");
  }
  if (T == 0) return;
  launch(hc_weights_kernel, int(ceil_div(T, 128)), 128, 0, S(stream_), pre.ptr<float>(), pre.stride[0],
         head_only ? nullptr : post.ptr<float>(), head_only ? 0 : post.stride[0],
         head_only ? nullptr : comb.ptr<float>(), head_only ? 0 : comb.stride[0], mix.ptr<const float>(),
         mix.stride[0], base.ptr<const float>(), scale.ptr<const float>(), T, n, iters, eps);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::hc_collapse(Tensor out, const Tensor& streams, const Tensor& pre) {
  Prof prof_scope(this, "hc_collapse");
  check_bf16_rows(out, "hc_collapse output");
  check_bf16_rows(streams, "hc_collapse streams");
  check_f32_rows(pre, "hc_collapse pre");
  const int T = int(out.shape[0]), D = int(out.shape[1]), n = int(pre.shape[1]);
  BELUGA_CHECK(streams.shape[0] == T && streams.shape[1] == int64_t(n) * D && pre.shape[0] == T,
               "hc_collapse: shapes");
  if (T == 0) return;
  launch(hc_collapse_kernel, grid_for(int64_t(T) * D), 256, 0, S(stream_), out.ptr<bf16>(), out.stride[0],
         streams.ptr<const bf16>(), streams.stride[0], pre.ptr<const float>(), pre.stride[0], T, n, D);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::hc_expand(Tensor out, const Tensor& streams, const Tensor& post, const Tensor& comb,
                        const Tensor& y) {
  Prof prof_scope(this, "hc_expand");
  check_bf16_rows(out, "hc_expand output");
  check_bf16_rows(streams, "hc_expand streams");
  check_bf16_rows(y, "hc_expand y");
  check_f32_rows(post, "hc_expand post");
  const int T = int(y.shape[0]), D = int(y.shape[1]), n = int(post.shape[1]);
  BELUGA_CHECK(streams.shape[0] == T && out.shape[0] == T && streams.shape[1] == int64_t(n) * D &&
                   out.shape[1] == int64_t(n) * D && comb.dtype == DType::kF32 &&
                   comb.numel() == int64_t(T) * n * n && comb.stride[comb.ndim - 1] == 1 &&
                   out.data != streams.data,
               "hc_expand: shapes (out must not alias streams)");
  if (T == 0) return;
  launch(hc_expand_kernel, grid_for(int64_t(T) * n * D), 256, 0, S(stream_), out.ptr<bf16>(), out.stride[0],
         streams.ptr<const bf16>(), streams.stride[0], post.ptr<const float>(), post.stride[0],
         comb.ptr<const float>(), comb.stride[0], y.ptr<const bf16>(), y.stride[0], T, n, D);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
