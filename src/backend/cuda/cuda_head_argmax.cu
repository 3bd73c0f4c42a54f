// Ops::head_argmax on CUDA: the vocabulary head's GEMV and each row's argmax (and its probability)
// in one kernel for decode-sized steps, where the composition launches a row gather, the GEMV and
// argmax_rows and writes the [R, V] logits in between.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_row_max.cuh"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kWarps = kGemvThreads / 32;

// Every block copies the M input rows (x[rows[r]]) into shared memory and computes its kWarps
// vocabulary units' logits (smem_gemv: the bits of linear's GEMV), folds them into one RowMax a row,
// and stores it in part[block, row]; the last block to arrive merges all blocks' partials (ties: the
// lowest id, as argmax_rows) and puts the counter back to 0.
template <int kRows, bool kProbs>
__global__ void __launch_bounds__(kGemvThreads, 4)
    head_argmax_kernel(int32_t* ids, float* probs, const bf16* x, int64_t ldx, const int32_t* rows,
                       const bf16* w, int64_t ldw, int M, int V, int D, RowMax* part, int* counter) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const GemvSums<kRows> y = smem_gemv<kRows>(w, ldw, M, V, D, [&](bf16* xs) {
    const int D8 = D / 8;
    for (int i = threadIdx.x; i < M * D8; i += kGemvThreads) {
      const int r = i / D8, c = i - r * D8;
      const bf16* src = x + int64_t(rows ? rows[r] : r) * ldx;
      reinterpret_cast<uint4*>(xs)[i] = reinterpret_cast<const uint4*>(src)[c];
    }
    __syncthreads();
  });
  __shared__ RowMax wpart[kRows][kWarps];
  __shared__ bool last;
  const int u = blockIdx.x * kWarps + warp;
  if (lane == 0)
    for (int r = 0; r < M; ++r) {
      RowMax m;
      if (u < V) push<kProbs>(m, y.v[r], u);
      wpart[r][warp] = m;
    }
  __syncthreads();
  if (threadIdx.x < M) {
    RowMax m = wpart[threadIdx.x][0];
    for (int k = 1; k < kWarps; ++k) merge<kProbs>(m, wpart[threadIdx.x][k]);
    part[int64_t(blockIdx.x) * kRows + threadIdx.x] = m;
  }
  __syncthreads();
  if (threadIdx.x == 0) last = arrive(counter) == int(gridDim.x) - 1;
  __syncthreads();
  if (!last) return;
  __shared__ RowMax bpart[kWarps];
  for (int r = 0; r < M; ++r) {
    RowMax m;
    for (int b = threadIdx.x; b < int(gridDim.x); b += kGemvThreads) {
      const RowMax* p = part + int64_t(b) * kRows + r;
      RowMax o;
      o.m = __ldcg(&p->m);
      o.s = __ldcg(&p->s);
      o.i = __ldcg(&p->i);
      merge<kProbs>(m, o);
    }
    warp_merge<kProbs>(m);
    if (lane == 0) bpart[warp] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < kWarps; ++k) merge<kProbs>(m, bpart[k]);
      ids[r] = m.i;
      if (kProbs) probs[r] = 1.0f / m.s;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) *counter = 0;  // every block has arrived: zero for the next launch
}

}  // namespace

void CudaOps::head_argmax(Tensor ids, Tensor probs, const Tensor& x, const Tensor& rows, const Weight& head) {
  const int M = int(ids.numel()), D = int(x.ndim == 2 ? x.shape[1] : 0), V = int(head.out_features());
  const bool shaped =
      x.dtype == DType::kBF16 && x.stride[1] == 1 && x.stride[0] % 8 == 0 && aligned16(x.data) &&
      ids.dtype == DType::kI32 && ids.is_contiguous() &&
      (probs.empty() || (probs.dtype == DType::kF32 && probs.is_contiguous() && probs.numel() == M)) &&
      (rows.empty() ? x.shape[0] >= M
                    : rows.dtype == DType::kI32 && rows.is_contiguous() && rows.numel() == M);
  const Tensor wb = shaped ? smem_gemv_weight(head, M, V, D) : Tensor{};
  if (wb.empty()) {
    Ops::head_argmax(ids, probs, x, rows, head);
    return;
  }
  Prof prof_scope(this, "head_argmax");
  const int grid = int(ceil_div(int64_t(V), kWarps));
  constexpr int64_t kPartFloats = sizeof(RowMax) / sizeof(float);
  static_assert(sizeof(RowMax) % sizeof(float) == 0);
  Tensor part = scratch(DType::kF32, {int64_t(grid) * kGemvRows * kPartFloats});
  const int32_t* rp = rows.empty() ? nullptr : rows.ptr<const int32_t>();
  float* pp = probs.empty() ? nullptr : probs.ptr<float>();
  auto go = [&](auto kernel) {
    launch(kernel, grid, kGemvThreads, size_t(M) * D * 2, S(stream_), ids.ptr<int32_t>(), pp,
           x.ptr<const bf16>(), x.stride[0], rp, wb.ptr<const bf16>(), wb.stride[0], M, V, D,
           reinterpret_cast<RowMax*>(part.data), arrival_counters(1));
  };
  if (M == 1)
    pp ? go(head_argmax_kernel<1, true>) : go(head_argmax_kernel<1, false>);
  else
    pp ? go(head_argmax_kernel<kGemvRows, true>) : go(head_argmax_kernel<kGemvRows, false>);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
