// Ops::argmax_rows on CUDA: each row's first maximum, and optionally its softmax probability (a
// speculative draft's confidence), without copying the logits to the host.
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

// A thread's running maximum (its first index) and, with kProbs, the sum of exp(l - max) over the
// elements it saw, rescaled whenever the maximum rises: one pass over the row.
struct RowMax {
  float m = -INFINITY, s = 0;
  int i = INT_MAX;
};

template <bool kProbs>
__device__ __forceinline__ void push(RowMax& r, float v, int i) {
  if (v > r.m || r.i == INT_MAX) {  // strictly greater: the lowest index wins ties within a thread
    if (kProbs) r.s = r.i == INT_MAX ? 1.0f : r.s * __expf(r.m - v) + 1.0f;
    r.m = v;
    r.i = i;
  } else if (kProbs && r.m > -INFINITY) {
    r.s += __expf(v - r.m);
  }
}

template <bool kProbs>
__device__ __forceinline__ void merge(RowMax& r, const RowMax& o) {
  const bool take = o.m > r.m || (o.m == r.m && o.i < r.i);
  if (kProbs) {
    const float m = fmaxf(r.m, o.m);
    r.s = m == -INFINITY ? r.s + o.s : r.s * __expf(r.m - m) + o.s * __expf(o.m - m);
  }
  if (take) {
    r.m = o.m;
    r.i = o.i;
  }
}

// One block per row: the first index of the row's maximum (as std::max_element on the host), and
// with kProbs its softmax probability, in one pass (16-byte loads where the rows allow: the demo
// model's 8192 logits took 6.7-8.1 us in two scalar passes, H100 run 353).
template <bool kProbs>
__global__ void argmax_kernel(int32_t* ids, float* probs, const float* logits, int64_t ld, int V, bool vec) {
  pdl_entry();
  __shared__ RowMax part[32];
  const float* row = logits + int64_t(blockIdx.x) * ld;
  RowMax r;
  if (vec) {
    const float4* row4 = reinterpret_cast<const float4*>(row);
#pragma unroll 4
    for (int c = threadIdx.x; c < V / 4; c += blockDim.x) {
      const float4 v = row4[c];
      push<kProbs>(r, v.x, 4 * c);
      push<kProbs>(r, v.y, 4 * c + 1);
      push<kProbs>(r, v.z, 4 * c + 2);
      push<kProbs>(r, v.w, 4 * c + 3);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x) push<kProbs>(r, row[i], i);
  }
  for (int o = 16; o > 0; o >>= 1) {
    RowMax x;
    x.m = __shfl_xor_sync(0xffffffffu, r.m, o);
    x.s = __shfl_xor_sync(0xffffffffu, r.s, o);
    x.i = __shfl_xor_sync(0xffffffffu, r.i, o);
    merge<kProbs>(r, x);
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) part[w] = r;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < int(blockDim.x >> 5); ++k) merge<kProbs>(r, part[k]);
    ids[blockIdx.x] = r.i;
    if (kProbs) probs[blockIdx.x] = 1.0f / r.s;
  }
}

}  // namespace

void CudaOps::argmax_rows(Tensor ids, const Tensor& logits, Tensor probs) {
  Prof prof_scope(this, "argmax_rows");
  BELUGA_CHECK(ids.dtype == DType::kI32 && logits.dtype == DType::kF32 && logits.ndim == 2 &&
                   logits.stride[1] == 1 && ids.numel() == logits.shape[0] &&
                   (probs.empty() || (probs.dtype == DType::kF32 && probs.numel() == logits.shape[0])),
               "argmax_rows: ids I32 [R], logits F32 [R, V], probs F32 [R] or none");
  const int R = int(logits.shape[0]);
  if (R == 0) return;
  const int V = int(logits.shape[1]);
  const bool vec = V % 4 == 0 && logits.stride[0] % 4 == 0 && aligned16(logits.data);
  launch(probs.empty() ? argmax_kernel<false> : argmax_kernel<true>, R, 512, 0, S(stream_),
         ids.ptr<int32_t>(), probs.empty() ? nullptr : probs.ptr<float>(), logits.ptr<const float>(),
         logits.stride[0], V, vec);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
