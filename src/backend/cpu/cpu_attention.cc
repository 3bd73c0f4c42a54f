// CPU attention over the paged cache: MLA (absorbed and expanded) and GQA. One task per
// (query token, head); scores in F32 with a max-subtracted softmax; causal within each sequence.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

namespace beluga {

namespace {

// Where query token t of sequence s sits: its sequence, and how many keys it may see.
struct QueryRef {
  int seq;
  int n_keys;
};

std::vector<QueryRef> query_refs(const AttnMeta& m) {
  std::vector<QueryRef> r(m.num_tokens);
  for (int s = 0; s < m.num_seqs; ++s)
    for (int t = m.h_query_start[s]; t < m.h_query_start[s + 1]; ++t)
      r[t] = {s, m.h_context_len[s] + (t - m.h_query_start[s]) + 1};
  return r;
}

int max_keys(const AttnMeta& m) {
  int mx = 1;
  for (int s = 0; s < m.num_seqs; ++s)
    mx = std::max(mx, m.h_context_len[s] + m.h_query_start[s + 1] - m.h_query_start[s]);
  return mx;
}

inline const float* cache_row(const Tensor& cache, const AttnMeta& m, int seq, int j) {
  const int32_t block = m.block_table[int64_t(seq) * m.max_blocks + j / m.block_size];
  return cache.ptr<const float>() + (int64_t(block) * m.block_size + j % m.block_size) * cache.shape[2];
}

// In-place softmax of p[0..n) (scores already scaled).
inline void softmax(float* p, int n) {
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) mx = std::max(mx, p[j]);
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - mx));
  const float inv = float(1.0 / sum);
  for (int j = 0; j < n; ++j) p[j] *= inv;
}

void check_cache(const Tensor& cache) {
  BELUGA_CHECK(cache.dtype == DType::kF32 && cache.ndim == 3 && cache.is_contiguous(),
               "CPU KV cache must be a contiguous F32 [blocks, block_size, entry] tensor, got ", cache.describe());
}

}  // namespace

void CpuOps::cache_write(Tensor cache, const Tensor& entries, const AttnMeta& m) {
  check_cache(cache);
  const int64_t D = cache.shape[2], slots = cache.shape[0] * cache.shape[1];
  BELUGA_CHECK(entries.shape[1] == D, "cache_write: entry width ", entries.shape[1], " != ", D);
  for (int t = 0; t < m.num_tokens; ++t) {
    const int32_t slot = m.slot_mapping[t];
    BELUGA_CHECK(slot >= 0 && slot < slots, "cache slot ", slot, " out of range");
    std::memcpy(cache.ptr<float>() + int64_t(slot) * D, entries.ptr<const float>() + t * entries.stride[0],
                D * sizeof(float));
  }
}

void CpuOps::mla_attention_absorbed(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_rank,
                                    float scale) {
  check_cache(cache);
  const int H = int(q.shape[1]), Dk = int(q.shape[2]);
  BELUGA_CHECK(Dk == cache.shape[2] && out.shape[2] == kv_rank, "mla_attention_absorbed: shapes");
  const auto refs = query_refs(m);
  const int nk = max_keys(m);
  Tensor scores = scratch(DType::kF32, {threads_, nk});
  const int64_t tasks = int64_t(m.num_tokens) * H;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 4)
  for (int64_t task = 0; task < tasks; ++task) {
    const int t = int(task / H), h = int(task % H);
    const QueryRef r = refs[t];
    float* p = scores.ptr<float>() + int64_t(omp_get_thread_num()) * nk;
    const float* qv = q.ptr<const float>() + t * q.stride[0] + h * q.stride[1];
    for (int j = 0; j < r.n_keys; ++j) p[j] = scale * k_->dot(qv, cache_row(cache, m, r.seq, j), Dk);
    softmax(p, r.n_keys);
    float* o = out.ptr<float>() + t * out.stride[0] + h * out.stride[1];
    std::memset(o, 0, kv_rank * sizeof(float));
    for (int j = 0; j < r.n_keys; ++j) k_->axpy(p[j], cache_row(cache, m, r.seq, j), o, kv_rank);
  }
}

void CpuOps::gather_context(Tensor out, const Tensor& cache, const AttnMeta& m) {
  check_cache(cache);
  const int64_t D = cache.shape[2];
  int64_t row = 0;
  for (int s = 0; s < m.num_seqs; ++s) {
    const int n = m.h_context_len[s] + m.h_query_start[s + 1] - m.h_query_start[s];
    for (int j = 0; j < n; ++j, ++row)
      std::memcpy(out.ptr<float>() + row * out.stride[0], cache_row(cache, m, s, j), D * sizeof(float));
  }
  BELUGA_ASSERT(row == out.shape[0]);
}

void CpuOps::mla_attention_expanded(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                    const AttnMeta& m, float scale) {
  const int H = int(q.shape[1]), Dqk = int(q.shape[2]), Dv = int(out.shape[2]);
  const int Dr = int(k_pe.shape[1]), Dn = Dqk - Dr;
  BELUGA_CHECK(kv.shape[1] == H && kv.shape[2] == Dn + Dv, "mla_attention_expanded: shapes");
  const auto refs = query_refs(m);
  std::vector<int64_t> base(m.num_seqs, 0);  // first gather_context row of each sequence
  for (int s = 1; s < m.num_seqs; ++s)
    base[s] = base[s - 1] + m.h_context_len[s - 1] + m.h_query_start[s] - m.h_query_start[s - 1];
  const int nk = max_keys(m);
  Tensor scores = scratch(DType::kF32, {threads_, nk});
  const int64_t tasks = int64_t(m.num_tokens) * H;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 4)
  for (int64_t task = 0; task < tasks; ++task) {
    const int t = int(task / H), h = int(task % H);
    const QueryRef r = refs[t];
    float* p = scores.ptr<float>() + int64_t(omp_get_thread_num()) * nk;
    const float* qv = q.ptr<const float>() + t * q.stride[0] + h * q.stride[1];
    for (int j = 0; j < r.n_keys; ++j) {
      const int64_t c = base[r.seq] + j;
      const float* kn = kv.ptr<const float>() + c * kv.stride[0] + h * kv.stride[1];
      const float* kp = k_pe.ptr<const float>() + c * k_pe.stride[0];
      p[j] = scale * (k_->dot(qv, kn, Dn) + k_->dot(qv + Dn, kp, Dr));
    }
    softmax(p, r.n_keys);
    float* o = out.ptr<float>() + t * out.stride[0] + h * out.stride[1];
    std::memset(o, 0, Dv * sizeof(float));
    for (int j = 0; j < r.n_keys; ++j) {
      const int64_t c = base[r.seq] + j;
      k_->axpy(p[j], kv.ptr<const float>() + c * kv.stride[0] + h * kv.stride[1] + Dn, o, Dv);
    }
  }
}

void CpuOps::gqa_attention(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_heads,
                           float scale) {
  check_cache(cache);
  const int H = int(q.shape[1]), D = int(q.shape[2]);
  BELUGA_CHECK(cache.shape[2] == 2 * kv_heads * D && H % kv_heads == 0, "gqa_attention: shapes");
  const int group = H / kv_heads;
  const auto refs = query_refs(m);
  const int nk = max_keys(m);
  Tensor scores = scratch(DType::kF32, {threads_, nk});
  const int64_t tasks = int64_t(m.num_tokens) * H;
#pragma omp parallel for num_threads(threads_) schedule(dynamic, 4)
  for (int64_t task = 0; task < tasks; ++task) {
    const int t = int(task / H), h = int(task % H), kvh = h / group;
    const QueryRef r = refs[t];
    float* p = scores.ptr<float>() + int64_t(omp_get_thread_num()) * nk;
    const float* qv = q.ptr<const float>() + t * q.stride[0] + h * q.stride[1];
    for (int j = 0; j < r.n_keys; ++j) p[j] = scale * k_->dot(qv, cache_row(cache, m, r.seq, j) + kvh * D, D);
    softmax(p, r.n_keys);
    float* o = out.ptr<float>() + t * out.stride[0] + h * out.stride[1];
    std::memset(o, 0, D * sizeof(float));
    for (int j = 0; j < r.n_keys; ++j)
      k_->axpy(p[j], cache_row(cache, m, r.seq, j) + (kv_heads + kvh) * D, o, D);
  }
}

}  // namespace beluga
