// Ops::argmax_rows on CUDA: each row's first maximum, and optionally its softmax probability (a
// speculative draft's confidence), without copying the logits to the host.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_row_max.cuh"

namespace beluga {

using namespace cuda;

namespace {

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
  warp_merge<kProbs>(r);
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
