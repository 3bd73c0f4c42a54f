// DeepSeek-V4's lightning indexer on the GPU (ops.h: indexer_topk), in two kernels. Scores: a block
// per (query row, 8 entries) with the row's query heads in shared memory, a warp per entry, the
// ReLU'd per-head dots weighted and summed in head order. Top-k: a block per query row finds the k-th
// largest score by a 4-pass radix select over order-preserving 32-bit keys, then writes the entries
// above it and the first ones equal to it, in index order (deterministic). Ties at the k-th score
// therefore go to the lowest indices; the CPU backend breaks them as torch.topk does (nth_element),
// so the two may pick different, equally scored entries (tests compare the scores of the picks).
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kScoreWarps = 8;
constexpr int kTopkThreads = 1024;

struct ScoreArgs {
  float* scores;  // [T, W]
  const bf16* q;  // [T, H, d]
  int64_t ldq_t, ldq_h;
  const bf16* keys;  // [W, d]
  int64_t ldk;
  const bf16* weights;  // [T, H]
  int64_t ldw;
  int T, H, d, W, rate, first_pos;
  float q_scale, w_scale;
};

__device__ __forceinline__ int visible_entries(int W, int first_pos, int t, int rate) {
  return min(W, (first_pos + t + 1) / rate);
}

__global__ void indexer_scores_kernel(ScoreArgs a) {
  pdl_entry();
  extern __shared__ float smem[];
  float* q = smem;            // [H * d]
  float* wt = q + a.H * a.d;  // [H]
  float* k = wt + a.H;        // [kScoreWarps][d]
  const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int visible = visible_entries(a.W, a.first_pos, t, a.rate);
  const int w = blockIdx.x * kScoreWarps + warp;
  if (int(blockIdx.x) * kScoreWarps >= visible) return;  // the whole block sees nothing
  for (int i = threadIdx.x; i < a.H * a.d; i += blockDim.x)
    q[i] = to_f(a.q[int64_t(t) * a.ldq_t + int64_t(i / a.d) * a.ldq_h + i % a.d]);
  for (int h = threadIdx.x; h < a.H; h += blockDim.x) wt[h] = to_f(a.weights[int64_t(t) * a.ldw + h]);
  float* kw = k + warp * a.d;
  if (w < visible)
    for (int i = lane; i < a.d; i += 32) kw[i] = to_f(a.keys[int64_t(w) * a.ldk + i]);
  __syncthreads();
  if (w >= visible) return;
  float s = 0;
  for (int h = 0; h < a.H; ++h) {
    float dot = 0;
    for (int i = lane; i < a.d; i += 32) dot += q[h * a.d + i] * kw[i];
    dot = warp_sum(dot);
    s += fmaxf(dot, 0.0f) * a.q_scale * (wt[h] * a.w_scale);
  }
  if (lane == 0) a.scores[int64_t(t) * a.W + w] = s == 0.0f ? 0.0f : s;  // no -0: keys order signed zeros
}

// Larger float, larger key (finite values and infinities).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads)
    indexer_select_kernel(int32_t* ids, int64_t ldi, const float* scores, int W, int K, int rate,
                          int first_pos) {
  pdl_entry();
  using Scan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_base, s_eq_base;
  const int t = blockIdx.x;
  const int visible = visible_entries(W, first_pos, t, rate), take = min(K, visible);
  const float* s = scores + int64_t(t) * W;
  int32_t* out = ids + int64_t(t) * ldi;
  for (int i = take + threadIdx.x; i < K; i += blockDim.x) out[i] = -1;
  if (take == 0) return;
  // The k-th largest key, one byte at a time from the top; `remaining`: how many entries equal to it
  // the selection takes.
  uint32_t prefix = 0, mask = 0;
  int remaining = take;
  if (take < visible) {
    for (int shift = 24; shift >= 0; shift -= 8) {
      for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
      __syncthreads();
      for (int w = threadIdx.x; w < visible; w += blockDim.x) {
        const uint32_t key = order_key(s[w]);
        if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        int above = 0, b = 255;
        for (; b > 0 && above + hist[b] < remaining; --b) above += hist[b];
        s_prefix = prefix | (uint32_t(b) << shift);
        s_remaining = remaining - above;
      }
      __syncthreads();
      prefix = s_prefix;
      remaining = s_remaining;
      mask |= 255u << shift;
      __syncthreads();
    }
  }
  // In index order: every entry above the k-th key, and the first `remaining` equal to it.
  const bool all = take == visible;
  if (threadIdx.x == 0) s_base = 0, s_eq_base = 0;
  __syncthreads();
  for (int w0 = 0; w0 < visible; w0 += blockDim.x) {
    const int w = w0 + threadIdx.x;
    const uint32_t key = w < visible ? order_key(s[w]) : 0;
    const bool eq = !all && w < visible && key == prefix;
    int eq_rank, eq_total;
    Scan(scan).ExclusiveSum(eq ? 1 : 0, eq_rank, eq_total);
    __syncthreads();
    const bool sel = w < visible && (all || key > prefix || (eq && s_eq_base + eq_rank < remaining));
    int pos, sel_total;
    Scan(scan).ExclusiveSum(sel ? 1 : 0, pos, sel_total);
    if (sel) out[s_base + pos] = w;
    __syncthreads();
    if (threadIdx.x == 0) s_base += sel_total, s_eq_base += eq_total;
    __syncthreads();
  }
}

}  // namespace

void CudaOps::indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, const Tensor& weights, int rate,
                           float q_scale, float w_scale, int first_pos) {
  Prof prof_scope(this, "indexer_topk");
  const int64_t T = q.shape[0], H = q.shape[1], d = q.shape[2], W = keys.empty() ? 0 : keys.shape[0];
  const int64_t K = ids.shape[1];
  BELUGA_CHECK(ids.dtype == DType::kI32 && ids.ndim == 2 && ids.stride[1] == 1 && ids.shape[0] == T &&
                   q.dtype == DType::kBF16 && q.ndim == 3 && q.stride[2] == 1 &&
                   weights.dtype == DType::kBF16 && weights.stride[1] == 1 && weights.shape[0] == T &&
                   weights.shape[1] == H &&
                   (W == 0 || (keys.dtype == DType::kBF16 && keys.stride[1] == 1 && keys.shape[1] == d)) &&
                   rate > 0 && first_pos >= 0,
               "indexer_topk: shapes ", q.describe(), " ", keys.describe(), " ", weights.describe(), " -> ",
               ids.describe());
  if (T == 0) return;
  const size_t smem = size_t(H * d + H + kScoreWarps * d) * sizeof(float);
  BELUGA_CHECK(smem <= 48 * 1024, "indexer_topk: ", H, " heads of ", d, " exceed the kernel's shared memory");
  Tensor scores = scratch(DType::kF32, {T, std::max<int64_t>(W, 1)});
  if (W > 0) {
    const ScoreArgs a{scores.ptr<float>(),
                      q.ptr<const bf16>(),
                      q.stride[0],
                      q.stride[1],
                      keys.ptr<const bf16>(),
                      keys.stride[0],
                      weights.ptr<const bf16>(),
                      weights.stride[0],
                      int(T),
                      int(H),
                      int(d),
                      int(W),
                      rate,
                      first_pos,
                      q_scale,
                      w_scale};
    launch(indexer_scores_kernel, dim3(unsigned(ceil_div(W, kScoreWarps)), unsigned(T)), kScoreWarps * 32,
           smem, S(stream_), a);
    BELUGA_LAUNCH_CHECK();
  }
  launch(indexer_select_kernel, unsigned(T), kTopkThreads, 0, S(stream_), ids.ptr<int32_t>(), ids.stride[0],
         scores.ptr<const float>(), int(W), int(K), rate, first_pos);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
