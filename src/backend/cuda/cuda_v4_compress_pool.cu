// DeepSeek-V4's compressor pooling on the GPU (ops.h: compress_pool): one thread per (window,
// channel) takes the softmax over the window's gate + position-bias logits (2 rate of them with
// overlapping windows) and the weighted sum of its kv values. F64 exponentials and sums as in the
// CPU backend: the op runs once per completed window, so its cost is small next to the projections.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

struct PoolArgs {
  bf16* out;
  int64_t ldo;
  const bf16 *kv, *gate;
  int64_t ldk, ldg;
  const float* ape;  // [rate, width]
  int64_t lda;
  int W, d, rate;
  bool overlap;
};

// Slot m of window w: the previous window's first series (m < rate, overlapping windows, w > 0),
// then this window's own (second, with overlap) series. Sets the row and channel offset read.
__device__ __forceinline__ void pool_slot(const PoolArgs& a, int w, int m, bool prev, int64_t* row, int* i,
                                          int* off) {
  if (prev && m < a.rate) {
    *row = int64_t(w - 1) * a.rate + m;
    *i = m;
    *off = 0;
  } else {
    *i = prev ? m - a.rate : m;
    *row = int64_t(w) * a.rate + *i;
    *off = a.overlap ? a.d : 0;
  }
}

__global__ void compress_pool_kernel(PoolArgs a) {
  pdl_entry();
  const int64_t total = int64_t(a.W) * a.d;
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < total;
       x += int64_t(gridDim.x) * blockDim.x) {
    const int w = int(x / a.d), ch = int(x % a.d);
    const bool prev = a.overlap && w > 0;
    const int slots = prev ? 2 * a.rate : a.rate;
    auto logit = [&](int m, int64_t* row, int* off) {
      int i;
      pool_slot(a, w, m, prev, row, &i, off);
      return double(to_f(a.gate[*row * a.ldg + *off + ch]) + a.ape[int64_t(i) * a.lda + *off + ch]);
    };
    int64_t row;
    int off;
    double mx = -INFINITY;
    for (int m = 0; m < slots; ++m) mx = fmax(mx, logit(m, &row, &off));
    double sum = 0;
    for (int m = 0; m < slots; ++m) sum += exp(logit(m, &row, &off) - mx);
    double acc = 0;
    for (int m = 0; m < slots; ++m) {
      const double p = double(float(exp(logit(m, &row, &off) - mx) / sum));
      acc += p * double(to_f(a.kv[row * a.ldk + off + ch]));
    }
    a.out[int64_t(w) * a.ldo + ch] = __float2bfloat16(float(acc));
  }
}

}  // namespace

void CudaOps::compress_pool(Tensor out, const Tensor& kv, const Tensor& gate, const Tensor& ape, int rate,
                            bool overlap) {
  Prof prof_scope(this, "compress_pool");
  check_bf16_rows(out, "compress_pool output");
  check_bf16_rows(kv, "compress_pool kv");
  check_bf16_rows(gate, "compress_pool gate");
  const int64_t W = out.shape[0], d = out.shape[1], width = overlap ? 2 * d : d;
  BELUGA_CHECK(ape.dtype == DType::kF32 && ape.ndim == 2 && ape.stride[1] == 1,
               "compress_pool: ape must be F32 [rate, width]");
  BELUGA_CHECK(rate > 0 && kv.shape[1] == width && gate.shape[1] == width && ape.shape[0] == rate &&
                   ape.shape[1] == width && kv.shape[0] >= W * rate && gate.shape[0] == kv.shape[0],
               "compress_pool: shapes");
  if (W == 0) return;
  const PoolArgs a{out.ptr<bf16>(),
                   out.stride[0],
                   kv.ptr<const bf16>(),
                   gate.ptr<const bf16>(),
                   kv.stride[0],
                   gate.stride[0],
                   ape.ptr<const float>(),
                   ape.stride[0],
                   int(W),
                   int(d),
                   rate,
                   overlap};
  launch(compress_pool_kernel, grid_for(W * d), 256, 0, S(stream_), a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
