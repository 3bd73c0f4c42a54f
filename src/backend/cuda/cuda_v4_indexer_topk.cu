// DeepSeek-V4's lightning indexer on the GPU (ops.h: v4_indexer_topk), in two kernels over the paged
// entry cache. Scores: a block per (query row, 64 entries) with the row's query heads in shared memory
// and the 64 entries' keys beside them (read through the block table); a thread per (entry, quarter of
// the heads) sums its heads' weighted ReLU'd dots, and the quarters are added in a fixed order.
// Top-k: a block per query row finds the k-th largest score by a 4-pass radix select over
// order-preserving 32-bit keys, then writes the entries above it and the first ones equal to it, in
// index order (deterministic). Ties at the k-th score therefore go to the lowest indices; the CPU
// backend breaks them as torch.topk does (nth_element), so the two may pick different, equally scored
// entries (tests compare the scores of the picks). Scores need [rows, entries] floats: long contexts
// run the rows in chunks.
#include <cub/block/block_scan.cuh>

#include "backend/cuda/cuda_kernel_config.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_v4_paged.cuh"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kScoreEntries = 64;  // entries per block
constexpr int kScoreParts = 4;     // head quarters: kScoreEntries * kScoreParts threads
constexpr int kScoreThreads = kScoreEntries * kScoreParts;
constexpr int kMaxHeadsPerPart = 16;
constexpr int kTopkThreads = 1024;

struct ScoreArgs {
  float* scores;  // [rows of the chunk, ld]
  int64_t lds;
  const bf16* q;  // [T, H, d]
  int64_t ldq_t, ldq_h;
  const bf16* keys;  // entry rows, d columns
  int64_t ldk;
  const bf16* weights;  // [T, H]
  int64_t ldw;
  int H, d, rate, per_block, row0;
  float q_scale, w_scale;
  V4Step step;
};

__global__ void __launch_bounds__(kScoreThreads) v4_indexer_scores_kernel(ScoreArgs a) {
  pdl_entry();
  extern __shared__ float smem[];
  const int t = a.row0 + int(blockIdx.y), w0 = int(blockIdx.x) * kScoreEntries;
  const V4Row r = v4_row(a.step, t);
  const int visible = (r.pos + 1) / a.rate;
  if (w0 >= visible) return;  // the whole block sees nothing
  const int kd = a.d + 8;     // padded key row (bf16): 16-byte reads of 8 lanes hit distinct banks
  bf16* k = reinterpret_cast<bf16*>(smem);                      // [kScoreEntries][kd]
  float* q = reinterpret_cast<float*>(k + kScoreEntries * kd);  // [H][d] (16-byte aligned: d % 8 == 0)
  float* part = q + a.H * a.d;                                  // [kScoreParts][kScoreEntries]
  float* wt = part + kScoreParts * kScoreEntries;               // [H]
  for (int i = threadIdx.x; i < a.H * a.d; i += blockDim.x)
    q[i] = to_f(a.q[int64_t(t) * a.ldq_t + int64_t(i / a.d) * a.ldq_h + i % a.d]) * a.q_scale;
  for (int h = threadIdx.x; h < a.H; h += blockDim.x)
    wt[h] = to_f(a.weights[int64_t(t) * a.ldw + h]) * a.w_scale;
  const int d8 = a.d / 8;
  for (int i = threadIdx.x; i < kScoreEntries * d8; i += blockDim.x) {
    const int j = i / d8, c8 = i % d8, w = w0 + j;
    uint4 v{};
    if (w < visible)
      v = reinterpret_cast<const uint4*>(a.keys + v4_entry_row(r.table, w, a.rate, a.per_block) * a.ldk)[c8];
    reinterpret_cast<uint4*>(k + j * kd)[c8] = v;
  }
  __syncthreads();
  const int j = threadIdx.x % kScoreEntries, pq = threadIdx.x / kScoreEntries;
  float dot[kMaxHeadsPerPart] = {};
  const bf16* kj = k + j * kd;
  for (int c8 = 0; c8 < d8; ++c8) {
    float kf[8];
    unpack8(reinterpret_cast<const uint4*>(kj)[c8], kf);
#pragma unroll
    for (int hh = 0; hh < kMaxHeadsPerPart; ++hh) {
      const int h = pq + hh * kScoreParts;
      if (h >= a.H) break;
      dot[hh] += dot8(q + h * a.d + c8 * 8, kf);
    }
  }
  float s = 0;
#pragma unroll
  for (int hh = 0; hh < kMaxHeadsPerPart; ++hh) {
    const int h = pq + hh * kScoreParts;
    if (h >= a.H) break;
    s += fmaxf(dot[hh], 0.0f) * wt[h];
  }
  part[pq * kScoreEntries + j] = s;
  __syncthreads();
  if (pq == 0 && w0 + j < visible) {
    float total = 0;
#pragma unroll
    for (int i = 0; i < kScoreParts; ++i) total += part[i * kScoreEntries + j];
    a.scores[int64_t(blockIdx.y) * a.lds + w0 + j] = total == 0.0f ? 0.0f : total;  // no -0
  }
}

// Larger float, larger key (finite values and infinities).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(kTopkThreads)
    v4_indexer_select_kernel(int32_t* ids, int64_t ldi, const float* scores, int64_t lds, int K, int rate,
                             int row0, V4Step step) {
  pdl_entry();
  using Scan = cub::BlockScan<int, kTopkThreads>;
  __shared__ typename Scan::TempStorage scan;
  __shared__ int hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int s_remaining, s_base, s_eq_base;
  const int t = row0 + int(blockIdx.x);
  const int visible = (step.positions[t] + 1) / rate, take = min(K, visible);
  const float* s = scores + int64_t(blockIdx.x) * lds;
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

size_t score_smem(int64_t H, int64_t d) {
  return size_t(H * d + H + kScoreParts * kScoreEntries) * sizeof(float) +
         size_t(kScoreEntries) * size_t(d + 8) * sizeof(bf16);
}

// Scores of at most this many bytes per launch pair: rows go in chunks past it.
constexpr int64_t kScoreBytes = int64_t(64) << 20;

}  // namespace

void cuda::configure_v4_indexer_kernels() {
  allow_dynamic_smem(v4_indexer_scores_kernel, int(score_smem(kScoreParts * kMaxHeadsPerPart, 256)));
}

void CudaOps::v4_indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, int per_block,
                              const Tensor& weights, int rate, float q_scale, float w_scale,
                              const AttnMeta& m) {
  Prof prof_scope(this, "v4_indexer_topk");
  const int64_t T = m.num_tokens, H = q.shape[1], d = q.shape[2], K = ids.shape[1];
  check_bf16_rows(keys, "v4_indexer_topk keys");
  BELUGA_CHECK(ids.dtype == DType::kI32 && ids.ndim == 2 && ids.stride[1] == 1 && ids.shape[0] == T &&
                   q.dtype == DType::kBF16 && q.ndim == 3 && q.stride[2] == 1 && q.shape[0] == T &&
                   weights.dtype == DType::kBF16 && weights.stride[1] == 1 && weights.shape[0] == T &&
                   weights.shape[1] == H && keys.shape[1] == d && rate > 0 && per_block > 0 && d % 8 == 0 &&
                   d <= 256 && H <= kScoreParts * kMaxHeadsPerPart && aligned16(keys.data) &&
                   m.block_size == 64 && keys.stride[0] % 8 == 0,
               "v4_indexer_topk: shapes ", q.describe(), " ", keys.describe(), " ", weights.describe(),
               " -> ", ids.describe());
  if (T == 0) return;
  // Entries a row may see: the block table's width in tokens over the rate (a graph's table is the
  // padded width, so one recording serves every context up to it).
  const int64_t W = std::max<int64_t>(1, int64_t(m.max_blocks) * m.block_size / rate);
  const int64_t chunk =
      std::max<int64_t>(1, std::min<int64_t>(T, kScoreBytes / (W * int64_t(sizeof(float)))));
  const ScratchMark mark = scratch_mark();
  Tensor scores = scratch(DType::kF32, {chunk, W});
  for (int64_t r0 = 0; r0 < T; r0 += chunk) {
    const int64_t n = std::min(chunk, T - r0);
    const ScoreArgs a{scores.ptr<float>(),
                      W,
                      q.ptr<const bf16>(),
                      q.stride[0],
                      q.stride[1],
                      keys.ptr<const bf16>(),
                      keys.stride[0],
                      weights.ptr<const bf16>(),
                      weights.stride[0],
                      int(H),
                      int(d),
                      rate,
                      per_block,
                      int(r0),
                      q_scale,
                      w_scale,
                      v4_step(m)};
    launch(v4_indexer_scores_kernel, dim3(unsigned(ceil_div(W, kScoreEntries)), unsigned(n)), kScoreThreads,
           score_smem(H, d), S(stream_), a);
    BELUGA_LAUNCH_CHECK();
    launch(v4_indexer_select_kernel, unsigned(n), kTopkThreads, 0, S(stream_), ids.ptr<int32_t>(),
           ids.stride[0], scores.ptr<const float>(), W, int(K), rate, int(r0), v4_step(m));
    BELUGA_LAUNCH_CHECK();
  }
  scratch_release(mark);
}

}  // namespace beluga
