// DeepSeek-V4's shared-KV attention with sinks on the GPU (ops.h: sink_attention). A block per
// (query row, head): the query in shared memory; a warp per visible row (the sliding window's rows,
// then the compressed entries: all complete ones, or the indexer's picks) computes its logit; a block
// softmax that includes the head's sink logit; then each thread sums p * row over its columns
// (K = V, so the rows are read twice, the second time coalesced along the head dimension). Simple
// rather than fast: rows per query are window + top-k (or context / rate), a few hundred.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kSinkThreads = 256;

struct SinkArgs {
  bf16* out;
  int64_t ldo_t, ldo_h;
  const bf16* q;
  int64_t ldq_t, ldq_h;
  const bf16* kv;  // [N, D]
  int64_t ldkv;
  const bf16* comp;  // [W, D] or null
  int64_t ldc;
  const int32_t* ids;  // [T, K] or null
  int64_t ldi;
  const float* sinks;
  int D, W, K, window, rate, first_pos, kv_first;
  float scale;
};

// The query's rows: slot i < nwin is kv row j0 + i - kv_first; the rest are compressed entries
// (all visible ones, or K picks of which those < 0 are skipped). Null: a skipped pick.
__device__ __forceinline__ const bf16* sink_row(const SinkArgs& a, int t, int i, int j0, int nwin) {
  if (i < nwin) return a.kv + int64_t(j0 + i - a.kv_first) * a.ldkv;
  i -= nwin;
  if (!a.ids) return a.comp + int64_t(i) * a.ldc;
  const int id = a.ids[int64_t(t) * a.ldi + i];
  return id < 0 ? nullptr : a.comp + int64_t(id) * a.ldc;
}

__device__ __forceinline__ float block_reduce(float v, float* red, bool max) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = max ? warp_max(v) : warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < warps; ++w) r = max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

__global__ void __launch_bounds__(kSinkThreads) sink_attention_kernel(SinkArgs a) {
  pdl_entry();
  extern __shared__ float smem[];
  __shared__ float red[kSinkThreads / 32];
  const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int p = a.first_pos + t, j0 = max(0, p - a.window + 1), nwin = p - j0 + 1;
  const int visible = a.W > 0 ? min(a.W, (p + 1) / a.rate) : 0;
  const int ncomp = a.W == 0 ? 0 : a.ids ? a.K : visible, n = nwin + ncomp;
  float* q = smem;            // [D]
  float* logit = smem + a.D;  // [n]
  const bf16* qh = a.q + int64_t(t) * a.ldq_t + int64_t(h) * a.ldq_h;
  for (int c = threadIdx.x; c < a.D; c += blockDim.x) q[c] = to_f(qh[c]);
  __syncthreads();
  for (int i = warp; i < n; i += blockDim.x / 32) {
    const bf16* row = sink_row(a, t, i, j0, nwin);
    float dot = 0;
    if (row)
      for (int c = lane; c < a.D; c += 32) dot += q[c] * to_f(row[c]);
    dot = warp_sum(dot);
    if (lane == 0) logit[i] = row ? dot * a.scale : -INFINITY;
  }
  __syncthreads();
  const float sink = a.sinks[h];
  float mx = sink;
  for (int i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, logit[i]);
  mx = block_reduce(mx, red, true);
  float sum = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = logit[i] == -INFINITY ? 0.0f : expf(logit[i] - mx);
    logit[i] = e;
    sum += e;
  }
  sum = block_reduce(sum, red, false) + expf(sink - mx);
  __syncthreads();
  const float inv = 1.0f / sum;
  bf16* o = a.out + int64_t(t) * a.ldo_t + int64_t(h) * a.ldo_h;
  for (int c = threadIdx.x; c < a.D; c += blockDim.x) {
    float acc = 0;
    for (int i = 0; i < n; ++i) {
      const float w = logit[i];
      if (w == 0.0f) continue;
      acc += w * inv * to_f(sink_row(a, t, i, j0, nwin)[c]);
    }
    o[c] = __float2bfloat16(acc);
  }
}

}  // namespace

void CudaOps::sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp,
                             const Tensor& comp_ids, const Tensor& sinks, int window, int rate, float scale,
                             int first_pos, int kv_first) {
  Prof prof_scope(this, "sink_attention");
  const int64_t T = q.shape[0], H = q.shape[1], D = q.shape[2], W = comp.empty() ? 0 : comp.shape[0];
  const int64_t N = kv.shape[0], K = comp_ids.empty() ? 0 : comp_ids.shape[1];
  BELUGA_CHECK(q.dtype == DType::kBF16 && q.ndim == 3 && q.stride[2] == 1 && out.dtype == DType::kBF16 &&
                   out.ndim == 3 && out.stride[2] == 1 && out.shape[0] == T && out.shape[1] == H &&
                   out.shape[2] == D && kv.dtype == DType::kBF16 && kv.stride[1] == 1 && kv.shape[1] == D &&
                   (W == 0 || (comp.dtype == DType::kBF16 && comp.stride[1] == 1 && comp.shape[1] == D)) &&
                   sinks.dtype == DType::kF32 && sinks.numel() == H && window > 0 && (W == 0 || rate > 0) &&
                   (comp_ids.empty() ||
                    (comp_ids.dtype == DType::kI32 && comp_ids.stride[1] == 1 && comp_ids.shape[0] == T)) &&
                   kv_first >= 0 && kv_first <= std::max(0, first_pos - window + 1) &&
                   kv_first + N >= first_pos + T,
               "sink_attention: shapes ", q.describe(), " ", kv.describe(), " ", comp.describe(), " -> ",
               out.describe());
  if (T == 0) return;
  // The last row sees the most: its window and every entry (or the K picks).
  const int64_t rows = window + (W == 0 ? 0 : comp_ids.empty() ? W : K);
  const size_t smem = size_t(D + rows) * sizeof(float);
  BELUGA_CHECK(smem <= 200 * 1024, "sink_attention: ", rows, " rows of ", D,
               " exceed the kernel's shared memory");
  if (smem > 48 * 1024) allow_dynamic_smem(sink_attention_kernel, int(smem));
  const SinkArgs a{out.ptr<bf16>(),
                   out.stride[0],
                   out.stride[1],
                   q.ptr<const bf16>(),
                   q.stride[0],
                   q.stride[1],
                   kv.ptr<const bf16>(),
                   kv.stride[0],
                   W == 0 ? nullptr : comp.ptr<const bf16>(),
                   W == 0 ? 0 : comp.stride[0],
                   comp_ids.empty() ? nullptr : comp_ids.ptr<const int32_t>(),
                   comp_ids.empty() ? 0 : comp_ids.stride[0],
                   sinks.ptr<const float>(),
                   int(D),
                   int(W),
                   int(K),
                   window,
                   rate,
                   first_pos,
                   kv_first,
                   scale};
  launch(sink_attention_kernel, dim3(unsigned(T), unsigned(H)), kSinkThreads, smem, S(stream_), a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
