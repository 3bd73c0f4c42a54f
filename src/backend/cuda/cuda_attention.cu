// Attention over the paged KV cache on the GPU (writing and gathering cache rows: cuda_kv_cache.cu;
// the absorbed MLA decode: cuda_mla_decode.cu).
// Fast path: MLA prefill, expanded (q/k 192 = nope 128 + rope 64, v 128), on wgmma
// (cuda_mla_prefill.cu).
// Any other shape (and GQA) runs the reference kernel: a block per (token, head, key split) (GQA: per
// KV head, for its group of query heads), scores in a global workspace, F32 throughout, splits merged
// in a fixed order. Both are tested against the CPU backend (tests/gpu).
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_attention_ref.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_mla_prefill.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

struct RefRow {
  const bf16* k;  // pointer to key element 0 (mode 1: k_nope; the rope part at kpe)
  const bf16* kpe;
  const bf16* v;
};

__device__ __forceinline__ RefRow ref_row(const RefArgs& a, int s, int64_t base, int h, int j) {
  RefRow r{};
  if (a.mode == 1) {
    const bf16* row = a.kv + (base + j) * a.kv0 + h * a.kv1;
    r.k = row;
    r.kpe = a.kpe + (base + j) * a.kpe0;
    r.v = row + a.nope;
  } else {
    const bf16* row =
        a.cache + (int64_t(a.bt[int64_t(s) * a.max_blocks + j / a.bs]) * a.bs + j % a.bs) * a.entry;
    if (a.mode == 0) {
      r.k = row;
      r.v = row;
    } else {
      const int kvh = h / a.group;
      r.k = row + int64_t(kvh) * a.Dk;
      r.v = row + int64_t(a.kv_heads + kvh) * a.Dk;
    }
  }
  return r;
}

__device__ __forceinline__ float ref_k(const RefArgs& a, const RefRow& r, int d) {
  if (a.mode == 1 && d >= a.nope) return to_f(r.kpe[d - a.nope]);
  return to_f(r.k[d]);
}

constexpr int kRefThreads = 256;            // 8 warps: a block's keys split 8 ways in both passes
constexpr int kRefDeterministicKeys = 128;  // --deterministic: keys of a split, whatever the batch
constexpr int kRefCols = 128;               // output columns a warp accumulates at once (4 a lane)

// Token t's sequence and how many keys it sees (its cached context and its chunk's rows up to itself).
struct TokenKeys {
  int s, n;
};
__device__ __forceinline__ TokenKeys token_keys(const RefArgs& a, int t) {
  const int s = seq_of_token(a.qs, a.S, t);
  return {s, a.ctx[s] + t - a.qs[s] + 1};
}
// Split z's partial for token t, head h (splits > 1): [Dv unnormalised sums | max | sum of exps].
__device__ __forceinline__ float* split_slot(const RefArgs& a, int t, int h, int z) {
  return a.part + ((int64_t(t) * a.H + h) * a.splits + z) * (a.Dv + 2);
}

// Merges a (token, head)'s splits in split order: sum_i w_i o_i / sum_i w_i l_i, w_i = exp(m_i - max).
// One split gives acc * (1 / sum), the bits of the unsplit kernel. The partials are read from L2
// (__ldcg): the last split's block reads what other blocks of its grid wrote.
__device__ void merge_splits(const RefArgs& a, int t, int h) {
  const int n = token_keys(a, t).n, used = (n + a.chunk - 1) / a.chunk;
  const int64_t stride = a.Dv + 2;
  const float* p = split_slot(a, t, h, 0);
  float m = -INFINITY;
  for (int i = 0; i < used; ++i) m = fmaxf(m, __ldcg(p + i * stride + a.Dv));
  auto weight = [&](int i) {
    const float mi = __ldcg(p + i * stride + a.Dv);
    return mi == m ? 1.0f : __expf(mi - m);
  };
  float l = 0;
  for (int i = 0; i < used; ++i) l += weight(i) * __ldcg(p + i * stride + a.Dv + 1);
  const float inv = 1.0f / l;
  for (int d = threadIdx.x; d < a.Dv; d += blockDim.x) {
    float acc = 0;
    for (int i = 0; i < used; ++i) acc += weight(i) * __ldcg(p + i * stride + d);
    a.out[t * a.o0 + h * a.o1 + d] = __float2bfloat16(acc * inv);
  }
}

// Every thread of a block whose split partial is written: whether it is the last of the token's
// splits holding keys to finish (it then merges them: no merge kernel, ~4.6 us a layer at batch 1 on
// the demo model, H100 run 353). Counts the block in on counter `slot` and puts it back to 0 when the
// count is complete.
__device__ __forceinline__ bool last_split(const RefArgs& a, int64_t slot, int n) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    last = arrive(a.counters + slot) == (n + a.chunk - 1) / a.chunk - 1;
    if (last) a.counters[slot] = 0;  // every split holding keys has arrived
  }
  __syncthreads();
  return last;
}

__global__ void ref_attention_kernel(RefArgs a) {
  pdl_entry();
  extern __shared__ float qsm[];
  __shared__ float red[33];
  const int h = blockIdx.x, t = blockIdx.y;
  const auto [s, n] = token_keys(a, t);
  // This block's keys; a split past the token's last key has nothing to add (the merge reads only
  // the splits that hold keys).
  const int j0 = int(blockIdx.z) * a.chunk, j1 = min(n, j0 + a.chunk);
  if (j0 >= n) return;
  int64_t base = a.qs[s];
  if (a.mode == 1)
    for (int i = 0; i < s; ++i) base += a.ctx[i];
  for (int d = threadIdx.x; d < a.Dk; d += blockDim.x) qsm[d] = to_f(a.q[t * a.q0 + h * a.q1 + d]);
  __syncthreads();
  float* sc = a.scores + (int64_t(t) * a.H + h) * a.max_keys;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float mx = -INFINITY;
  for (int j = j0 + w; j < j1; j += nw) {
    const RefRow r = ref_row(a, s, base, h, j);
    float dot = 0;
    for (int d = lane; d < a.Dk; d += 32) dot += qsm[d] * ref_k(a, r, d);
    dot = warp_sum(dot) * a.scale;
    if (lane == 0) sc[j] = dot;
    mx = fmaxf(mx, dot);
  }
  mx = block_max(mx, red);
  float sum = 0;
  for (int j = j0 + int(threadIdx.x); j < j1; j += blockDim.x) {
    const float p = __expf(sc[j] - mx);
    sc[j] = p;
    sum += p;
  }
  sum = block_sum(sum, red);  // its barriers also order the writes to sc before the reads below
  const float inv = 1.0f / sum;
  // P.V with the keys split over the warps (each lane 4 columns of a 128-wide group, a warp's row
  // loads coalesced), the warps' partial sums added in a fixed order: one thread per column looping
  // over every key ran ~0.28 us a key per layer at batch 1 (demo model, H100; bench/NOTES.md run 306);
  // split, the demo's plain decode ran 1.5-1.7x faster (run 318).
  float* part = qsm + a.Dk;  // [warps, Dv]
  for (int d0 = 0; d0 < a.Dv; d0 += kRefCols) {
    float acc[kRefCols / 32] = {};
    for (int j = j0 + w; j < j1; j += nw) {
      const RefRow r = ref_row(a, s, base, h, j);
      const float p = sc[j];
#pragma unroll
      for (int c = 0; c < kRefCols / 32; ++c) {
        const int d = d0 + lane + 32 * c;
        if (d < a.Dv) acc[c] += p * to_f(r.v[d]);
      }
    }
#pragma unroll
    for (int c = 0; c < kRefCols / 32; ++c) {
      const int d = d0 + lane + 32 * c;
      if (d < a.Dv) part[w * a.Dv + d] = acc[c];
    }
  }
  __syncthreads();
  float* split = a.splits > 1 ? split_slot(a, t, h, int(blockIdx.z)) : nullptr;
  for (int d = threadIdx.x; d < a.Dv; d += blockDim.x) {
    float acc = 0;
    for (int i = 0; i < nw; ++i) acc += part[i * a.Dv + d];
    if (split)
      split[d] = acc;
    else
      a.out[t * a.o0 + h * a.o1 + d] = __float2bfloat16(acc * inv);
  }
  if (split && threadIdx.x == 0) {
    split[a.Dv] = mx;
    split[a.Dv + 1] = sum;
  }
  if (split && a.counters && last_split(a, int64_t(t) * a.H + h, n)) merge_splits(a, t, h);
}

__global__ void ref_merge_kernel(RefArgs a) {
  pdl_entry();
  merge_splits(a, int(blockIdx.y), int(blockIdx.x));
}

// GQA, G query heads to a KV head: a block per (token, KV head, key split) serves the G heads, so each
// key and value row is read once for all of them (the per-head kernel above read it G times, from
// HBM once a step's KV outgrows L2). Each head's sums run in the per-head kernel's order.
template <int G>
__global__ void gqa_ref_attention_kernel(RefArgs a) {
  pdl_entry();
  extern __shared__ float smem[];  // q [G, Dk], then the warps' partial P.V sums [warps, G, Dv]
  __shared__ float red[33];
  const int kvh = blockIdx.x, t = blockIdx.y;
  const auto [s, n] = token_keys(a, t);
  const int j0 = int(blockIdx.z) * a.chunk, j1 = min(n, j0 + a.chunk);
  if (j0 >= n) return;
  float* qsm = smem;
  for (int i = threadIdx.x; i < G * a.Dk; i += blockDim.x)
    qsm[i] = to_f(a.q[t * a.q0 + (kvh * G + i / a.Dk) * a.q1 + i % a.Dk]);
  __syncthreads();
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float* sc = a.scores + (int64_t(t) * a.H + kvh * G) * a.max_keys;  // head g's at g * max_keys
  float mx[G], sum[G];
#pragma unroll
  for (int g = 0; g < G; ++g) mx[g] = -INFINITY;
  for (int j = j0 + w; j < j1; j += nw) {
    const bf16* k = ref_row(a, s, 0, kvh * G, j).k;
    float dot[G] = {};
    for (int d = lane; d < a.Dk; d += 32) {
      const float kd = to_f(k[d]);
#pragma unroll
      for (int g = 0; g < G; ++g) dot[g] += qsm[g * a.Dk + d] * kd;
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float x = warp_sum(dot[g]) * a.scale;
      if (lane == 0) sc[g * a.max_keys + j] = x;
      mx[g] = fmaxf(mx[g], x);
    }
  }
#pragma unroll
  for (int g = 0; g < G; ++g) {
    mx[g] = block_max(mx[g], red);
    float part_sum = 0;
    for (int j = j0 + int(threadIdx.x); j < j1; j += blockDim.x) {
      const float p = __expf(sc[g * a.max_keys + j] - mx[g]);
      sc[g * a.max_keys + j] = p;
      part_sum += p;
    }
    sum[g] = block_sum(part_sum, red);  // the last one's barriers order every head's writes to sc
  }
  float* part = smem + G * a.Dk;
  for (int d0 = 0; d0 < a.Dv; d0 += kRefCols) {
    float acc[G][kRefCols / 32] = {};
    for (int j = j0 + w; j < j1; j += nw) {
      const bf16* v = ref_row(a, s, 0, kvh * G, j).v;
      float p[G];
#pragma unroll
      for (int g = 0; g < G; ++g) p[g] = sc[g * a.max_keys + j];
#pragma unroll
      for (int c = 0; c < kRefCols / 32; ++c) {
        const int d = d0 + lane + 32 * c;
        if (d < a.Dv) {
          const float vd = to_f(v[d]);
#pragma unroll
          for (int g = 0; g < G; ++g) acc[g][c] += p[g] * vd;
        }
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int c = 0; c < kRefCols / 32; ++c) {
        const int d = d0 + lane + 32 * c;
        if (d < a.Dv) part[(w * G + g) * a.Dv + d] = acc[g][c];
      }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * a.Dv; i += blockDim.x) {
    const int g = i / a.Dv, d = i % a.Dv, h = kvh * G + g;
    float acc = 0;
    for (int k = 0; k < nw; ++k) acc += part[(k * G + g) * a.Dv + d];
    if (a.splits > 1)
      split_slot(a, t, h, int(blockIdx.z))[d] = acc;
    else
      a.out[t * a.o0 + h * a.o1 + d] = __float2bfloat16(acc * (1.0f / sum[g]));
  }
  if (a.splits > 1 && threadIdx.x < G) {
    float* split = split_slot(a, t, kvh * G + int(threadIdx.x), int(blockIdx.z));
    split[a.Dv] = mx[threadIdx.x];
    split[a.Dv + 1] = sum[threadIdx.x];
  }
  if (a.splits > 1 && a.counters && last_split(a, int64_t(t) * a.kv_heads + kvh, n))
    for (int g = 0; g < G; ++g) merge_splits(a, t, kvh * G + g);
}

// Shared memory of a reference block serving `heads` query heads: their queries and the warps' partial
// P.V sums.
size_t ref_smem(const RefArgs& a, int heads) {
  return (size_t(heads) * a.Dk + size_t(kRefThreads / 32) * heads * a.Dv) * sizeof(float);
}

// The query heads a block of the reference kernel serves: a GQA group of 2, 4 or 8 (its shared
// memory within the default 48 KB), else 1.
int heads_per_block(const RefArgs& a) {
  const bool group = a.mode == 2 && (a.group == 2 || a.group == 4 || a.group == 8) && a.Dk == a.Dv;
  return group && ref_smem(a, a.group) <= 48 * 1024 ? a.group : 1;
}

// ---------------------------------------------------------------------------------------------
}  // namespace

namespace cuda {

void run_reference(RefArgs a, int T, int max_keys_, Tensor scores, cudaStream_t st) {
  a.scores = scores.ptr<float>();
  a.max_keys = max_keys_;
  const int heads = heads_per_block(a);
  const size_t smem = ref_smem(a, heads);
  BELUGA_CHECK(smem <= 48 * 1024, "reference attention: head dims ", a.Dk, "/", a.Dv, " need ", smem,
               " bytes of shared memory");
  BELUGA_CHECK(
      a.splits >= 1 && a.chunk >= 1 && int64_t(a.splits) * a.chunk >= max_keys_ && (a.splits == 1 || a.part),
      "reference attention: ", a.splits, " splits of ", a.chunk, " keys for ", max_keys_);
  const dim3 groups(a.kv_heads, T, a.splits);
  switch (heads) {
    case 2:
      launch(gqa_ref_attention_kernel<2>, groups, kRefThreads, smem, st, a);
      break;
    case 4:
      launch(gqa_ref_attention_kernel<4>, groups, kRefThreads, smem, st, a);
      break;
    case 8:
      launch(gqa_ref_attention_kernel<8>, groups, kRefThreads, smem, st, a);
      break;
    default:
      launch(ref_attention_kernel, dim3(a.H, T, a.splits), kRefThreads, smem, st, a);
  }
  BELUGA_LAUNCH_CHECK();
  if (a.splits == 1 || a.counters) return;
  launch(ref_merge_kernel, dim3(a.H, T), 128, 0, st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace cuda

void CudaOps::mla_attention_expanded(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                     const AttnMeta& m, float scale) {
  Prof prof_scope(this, "mla_attention_expanded");
  const int T = m.num_tokens, H = int(q.shape[1]), Dqk = int(q.shape[2]), Dv = int(out.shape[2]);
  const int Dr = int(k_pe.shape[1]), Dn = Dqk - Dr;
  BELUGA_CHECK(q.dtype == DType::kBF16 && kv.dtype == DType::kBF16 && k_pe.dtype == DType::kBF16 &&
                   kv.shape[1] == H && kv.shape[2] == Dn + Dv && q.stride[2] == 1 && kv.stride[2] == 1 &&
                   k_pe.stride[1] == 1 && out.stride[2] == 1,
               "mla_attention_expanded: shapes");
  if (T == 0) return;
  const bool fast = !reference_attention_ && Dqk == kPrefillDk && Dn == kPrefillNope && Dv == kPrefillDv &&
                    q.stride[0] % 8 == 0 && q.stride[1] % 8 == 0 && kv.stride[0] % 8 == 0 &&
                    kv.stride[1] % 8 == 0 && k_pe.stride[0] % 8 == 0 && aligned16(q.data) &&
                    aligned16(kv.data) && aligned16(k_pe.data) && out.stride[1] % 2 == 0 &&
                    out.stride[0] % 2 == 0;
  if (!fast) {
    RefArgs a{};
    a.mode = 1;
    set_q_out(a, q, out);
    set_kv(a, kv, k_pe);
    a.nope = Dn;
    set_seqs(a, m);
    reference_attention(a, m, H, Dqk, Dv, scale);
    return;
  }
  PrefillArgs a{};
  set_q_out(a, q, out);
  set_kv(a, kv, k_pe);
  set_seqs(a, m);
  a.scale_log2 = scale * kLog2e;
  a.heads = H;
  std::vector<int> key = {H};
  for (int s = 0; s < m.num_seqs; ++s) {
    key.push_back(m.h_query_start[s + 1] - m.h_query_start[s]);
    key.push_back(m.h_context_len[s]);
  }
  if (key != prefill_split_.key) {
    const PrefillSplit p = plan_prefill_split(m, H, sm_count_, int(kArrivalCounters));
    prefill_split_ = {std::move(key), p.items, p.split_min, p.max_split};
  }
  const PrefillSplit split{prefill_split_.items, prefill_split_.split_min, prefill_split_.max_split};
  a.split_min = split.split_min;
  a.max_split = split.max_split;
  if (split.max_split > 0) {
    a.part = scratch(DType::kF32, {prefill_part_floats(split, H, m.num_seqs)}).ptr<float>();
    a.counters = arrival_counters(int64_t(m.num_seqs) * H * split.max_split);
  }
  run_mla_prefill_wgmma(a, split, m.num_seqs, S(stream_));
}

void CudaOps::gqa_attention(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_heads,
                            float scale) {
  Prof prof_scope(this, "gqa_attention");
  check_cache(cache);
  const int T = m.num_tokens, H = int(q.shape[1]), D = int(q.shape[2]);
  BELUGA_CHECK(q.dtype == DType::kBF16 && cache.shape[2] == 2 * kv_heads * D && H % kv_heads == 0 &&
                   q.stride[2] == 1 && out.stride[2] == 1,
               "gqa_attention: shapes");
  if (T == 0) return;
  RefArgs a{};
  a.mode = 2;
  set_q_out(a, q, out);
  set_paged(a, cache, m);
  a.entry = int(cache.shape[2]);
  a.kv_heads = kv_heads;
  a.group = H / kv_heads;
  reference_attention(a, m, H, D, D, scale);
}

void CudaOps::reference_attention(RefArgs& a, const AttnMeta& m, int H, int Dk, int Dv, float scale) {
  a.H = H;
  a.Dk = Dk;
  a.Dv = Dv;
  a.scale = scale;
  const int nk = max_keys(m), T = m.num_tokens;
  // Where (token, head) blocks leave SMs idle, keys split so the grid fills the GPU (about two blocks
  // an SM), in chunks of 32 keys at least: at batch 1 the demo model's 4 heads were 4 blocks, each
  // walking every key (plain decode 1.47x faster split; at 256 blocks the merge's launch cost 4 %,
  // bench/NOTES.md run 339). --deterministic: chunks of
  // a fixed count, so a token's merge order does not depend on the batch.
  const int64_t blocks = int64_t(T) * H / heads_per_block(a), sms = std::max(1, sm_count_), target = 2 * sms;
  int64_t chunk = deterministic_ ? kRefDeterministicKeys
                  : blocks > sms
                      ? nk
                      : std::max<int64_t>(32, ceil_div(ceil_div(int64_t(nk) * blocks, target), 32) * 32);
  a.chunk = int(std::max<int64_t>(1, std::min<int64_t>(chunk, nk)));
  a.splits = int(ceil_div(nk, a.chunk));
  a.part = a.splits > 1 ? scratch(DType::kF32, {int64_t(T) * H * a.splits, int64_t(Dv) + 2}).ptr<float>()
                        : nullptr;
  // The last split of each (token, head group) merges them (splits leave the grid within ~2 blocks an
  // SM, so the counters fit).
  const int64_t slots = int64_t(T) * H / heads_per_block(a);
  a.counters = a.splits > 1 && slots <= kArrivalCounters ? arrival_counters(slots) : nullptr;
  run_reference(a, T, nk, scratch(DType::kF32, {int64_t(T) * H, nk}), S(stream_));
}

}  // namespace beluga
