// Ops::argmax_rows on CUDA: each row's first maximum, and optionally its softmax probability (a
// speculative draft's confidence), without copying the logits to the host.
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

// One block per row: the first index of the row's maximum (as std::max_element on the host), and
// with `probs` its softmax probability (a second pass over the row, summing exp(l - max)).
__global__ void argmax_kernel(int32_t* ids, float* probs, const float* logits, int64_t ld, int V) {
  pdl_entry();
  __shared__ float sv[32];
  __shared__ int si[32];
  const float* row = logits + int64_t(blockIdx.x) * ld;
  float best = -INFINITY;
  int bi = INT_MAX;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    const float v = row[i];
    if (v > best || bi == INT_MAX) {  // strictly greater: the lowest index wins ties within a thread
      best = v;
      bi = i;
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    if (ov > best || (ov == best && oi < bi)) {
      best = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) {
    sv[w] = best;
    si[w] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < int(blockDim.x >> 5); ++k)
      if (sv[k] > best || (sv[k] == best && si[k] < bi)) {
        best = sv[k];
        bi = si[k];
      }
    ids[blockIdx.x] = bi;
    sv[0] = best;
  }
  if (!probs) return;
  __syncthreads();
  const float mx = sv[0];
  float sum = 0;
  for (int i = threadIdx.x; i < V; i += blockDim.x) sum += __expf(row[i] - mx);
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  __syncthreads();  // everyone has read sv[0]
  if (lane == 0) sv[w] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0;
    for (int k = 0; k < int(blockDim.x >> 5); ++k) total += sv[k];
    probs[blockIdx.x] = 1.0f / total;
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
  launch(argmax_kernel, R, 512, 0, S(stream_), ids.ptr<int32_t>(),
         probs.empty() ? nullptr : probs.ptr<float>(), logits.ptr<const float>(), logits.stride[0],
         int(logits.shape[1]));
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
