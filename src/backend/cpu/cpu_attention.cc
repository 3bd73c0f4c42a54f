// CPU attention over the paged cache: MLA (absorbed and expanded) and GQA.
// Scores and outputs are GEMMs through the kernel table: per (sequence, head) the keys are gathered
// once into K^T [Dk, C] and V [C, Dv], then each block of queries computes
// S = Q K^T, a causal softmax in F32, and O = S V. Absorbed MLA (decode) shares one latent K among
// all heads, so each cache row is read once per token for every head at once.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

namespace beluga {

namespace {

constexpr int kQueryBlock = 32;

int seq_keys(const AttnMeta& m, int s) {
  return m.h_context_len[s] + m.h_query_start[s + 1] - m.h_query_start[s];
}

int max_keys(const AttnMeta& m) {
  int mx = 1;
  for (int s = 0; s < m.num_seqs; ++s) mx = std::max(mx, seq_keys(m, s));
  return mx;
}

inline const float* cache_row(const Tensor& cache, const AttnMeta& m, int seq, int j) {
  const int32_t block = m.block_table[int64_t(seq) * m.max_blocks + j / m.block_size];
  return cache.ptr<const float>() + (int64_t(block) * m.block_size + j % m.block_size) * cache.shape[2];
}

// Scales row p[0..n) and turns it into a softmax; entries [n, width) become 0 (causal mask).
inline void softmax_row(const cpu::Kernels& k, float* p, int n, int width, float scale) {
  float mx = -INFINITY;
  for (int j = 0; j < n; ++j) mx = std::max(mx, p[j]);
  const float inv = 1.0f / k.exp_sum(p, n, scale, mx * scale);
  for (int j = 0; j < n; ++j) p[j] *= inv;
  for (int j = n; j < width; ++j) p[j] = 0.0f;
}

cpu::GemmArgs f32_gemm(const float* x, int64_t ldx, int M, int K, const float* w, int64_t ldw, float* out,
                       int64_t ldo) {
  cpu::GemmArgs a{};
  a.x = x;
  a.ldx = ldx;
  a.M = M;
  a.K = K;
  a.w = w;
  a.wtype = DType::kF32;
  a.ldw = ldw;
  a.out = out;
  a.ldo = ldo;
  return a;
}

// Causal attention of Tq queries (row stride ldq) against K^T [Dk, ldk >= keys] and V [keys, Dv];
// query i sees keys [0, first + i + 1). S is scratch for kQueryBlock x keys scores.
void attend(const cpu::Kernels& k, const float* q, int64_t ldq, int Tq, int Dk, const float* Kt, int64_t ldk,
            const float* V, int Dv, int first, float scale, float* out, int64_t ldo, float* S) {
  for (int q0 = 0; q0 < Tq; q0 += kQueryBlock) {
    const int rows = std::min(kQueryBlock, Tq - q0);
    const int width = first + q0 + rows;
    k.gemm_nn(q + q0 * ldq, ldq, rows, Dk, Kt, ldk, width, S, width);
    for (int i = 0; i < rows; ++i) softmax_row(k, S + int64_t(i) * width, first + q0 + i + 1, width, scale);
    k.gemm_nn(S, width, rows, width, V, Dv, Dv, out + q0 * ldo, ldo);
  }
}

void check_cache(const Tensor& cache) {
  BELUGA_CHECK(cache.dtype == DType::kF32 && cache.ndim == 3 && cache.is_contiguous(),
               "CPU KV cache must be a contiguous F32 [blocks, block_size, entry] tensor, got ",
               cache.describe());
}

}  // namespace

void CpuOps::cache_write(Tensor cache, const Tensor& entries, const AttnMeta& m) {
  cpu::OpProfile::Scope prof(profile_, "cache_write");
  check_cache(cache);
  const int64_t D = cache.shape[2], slots = cache.shape[0] * cache.shape[1];
  BELUGA_CHECK(entries.shape[1] == D, "cache_write: entry width ", entries.shape[1], " != ", D);
  for (int t = 0; t < m.num_tokens; ++t) {
    const int32_t slot = m.slot_mapping[t];
    if (slot < 0) continue;  // a padding row
    BELUGA_CHECK(slot < slots, "cache slot ", slot, " out of range");
    std::memcpy(cache.ptr<float>() + int64_t(slot) * D, entries.ptr<const float>() + t * entries.stride[0],
                D * sizeof(float));
  }
}

void CpuOps::mla_attention_absorbed(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                                    int kv_rank, float scale) {
  cpu::OpProfile::Scope prof(profile_, "mla_attention_absorbed");
  check_cache(cache);
  const int H = int(q.shape[1]), Dk = int(q.shape[2]);
  BELUGA_CHECK(Dk == cache.shape[2] && out.shape[2] == kv_rank && q.stride[2] == 1,
               "mla_attention_absorbed: shapes");
  // Tasks: (query token, group of heads). Splitting heads keeps every thread busy at batch 1.
  const int groups = std::max(1, std::min(H, (2 * threads_ + m.num_tokens - 1) / std::max(1, m.num_tokens)));
  const int per = (H + groups - 1) / groups;
  const int nk = max_keys(m);
  Tensor scores = scratch(DType::kF32, {threads_, int64_t(per) * nk});
  std::vector<int> seq_of(m.num_tokens);
  for (int s = 0; s < m.num_seqs; ++s)
    for (int t = m.h_query_start[s]; t < m.h_query_start[s + 1]; ++t) seq_of[t] = s;
  const int64_t tasks = int64_t(m.num_tokens) * groups;
#pragma omp parallel for num_threads(threads_) schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    const int t = int(task / groups), h0 = int(task % groups) * per, h1 = std::min(H, h0 + per);
    if (h0 >= h1) continue;
    const int s = seq_of[t], nh = h1 - h0;
    const int n = m.h_context_len[s] + (t - m.h_query_start[s]) + 1;
    float* S = scores.ptr<float>() + int64_t(omp_get_thread_num()) * per * nk;
    const float* qv = q.ptr<const float>() + t * q.stride[0] + h0 * q.stride[1];
    // S[h, j] = q_h . row_j, one cache block (contiguous rows) at a time.
    for (int j0 = 0; j0 < n; j0 += m.block_size) {
      const int cnt = std::min(m.block_size, n - j0);
      k_->gemm(f32_gemm(qv, q.stride[1], nh, Dk, cache_row(cache, m, s, j0), Dk, S + j0, nk), 0, cnt);
    }
    for (int h = 0; h < nh; ++h) softmax_row(*k_, S + int64_t(h) * nk, n, n, scale);
    for (int h = 0; h < nh; ++h)
      std::memset(out.ptr<float>() + t * out.stride[0] + (h0 + h) * out.stride[1], 0,
                  kv_rank * sizeof(float));
    for (int j = 0; j < n; ++j) {
      const float* row = cache_row(cache, m, s, j);
      for (int h = 0; h < nh; ++h)
        k_->axpy(S[int64_t(h) * nk + j], row, out.ptr<float>() + t * out.stride[0] + (h0 + h) * out.stride[1],
                 kv_rank);
    }
  }
}

void CpuOps::gather_context(Tensor out, const Tensor& cache, const AttnMeta& m) {
  cpu::OpProfile::Scope prof(profile_, "gather_context");
  check_cache(cache);
  const int64_t D = cache.shape[2];
  int64_t row = 0;
  for (int s = 0; s < m.num_seqs; ++s) {
    const int n = seq_keys(m, s);
    for (int j = 0; j < n; ++j, ++row)
      std::memcpy(out.ptr<float>() + row * out.stride[0], cache_row(cache, m, s, j), D * sizeof(float));
  }
  BELUGA_ASSERT(row == out.shape[0]);
}

void CpuOps::mla_attention_expanded(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                    const AttnMeta& m, float scale) {
  cpu::OpProfile::Scope prof(profile_, "mla_attention_expanded");
  const int H = int(q.shape[1]), Dqk = int(q.shape[2]), Dv = int(out.shape[2]);
  const int Dr = int(k_pe.shape[1]), Dn = Dqk - Dr;
  BELUGA_CHECK(kv.shape[1] == H && kv.shape[2] == Dn + Dv && q.stride[2] == 1,
               "mla_attention_expanded: shapes");
  std::vector<int64_t> base(m.num_seqs, 0);  // first gather_context row of each sequence
  for (int s = 1; s < m.num_seqs; ++s) base[s] = base[s - 1] + seq_keys(m, s - 1);
  const int nk = max_keys(m);
  const int64_t per_thread = int64_t(nk) * Dqk + int64_t(Dv) * nk + int64_t(kQueryBlock) * nk;
  Tensor work = scratch(DType::kF32, {threads_, per_thread});
  const int64_t tasks = int64_t(m.num_seqs) * H;
#pragma omp parallel for num_threads(threads_) schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    const int s = int(task / H), h = int(task % H);
    const int n = seq_keys(m, s), Tq = m.h_query_start[s + 1] - m.h_query_start[s];
    float* Kt = work.ptr<float>() + int64_t(omp_get_thread_num()) * per_thread;
    float* V = Kt + int64_t(nk) * Dqk;
    float* S = V + int64_t(Dv) * nk;
    for (int j = 0; j < n; ++j) {
      const float* row = kv.ptr<const float>() + (base[s] + j) * kv.stride[0] + h * kv.stride[1];
      const float* pe = k_pe.ptr<const float>() + (base[s] + j) * k_pe.stride[0];
      for (int d = 0; d < Dn; ++d) Kt[int64_t(d) * n + j] = row[d];
      for (int d = 0; d < Dr; ++d) Kt[int64_t(Dn + d) * n + j] = pe[d];
      std::memcpy(V + int64_t(j) * Dv, row + Dn, Dv * sizeof(float));
    }
    const int t0 = m.h_query_start[s];
    attend(*k_, q.ptr<const float>() + t0 * q.stride[0] + h * q.stride[1], q.stride[0], Tq, Dqk, Kt, n, V, Dv,
           m.h_context_len[s], scale, out.ptr<float>() + t0 * out.stride[0] + h * out.stride[1],
           out.stride[0], S);
  }
}

void CpuOps::gqa_attention(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_heads,
                           float scale) {
  cpu::OpProfile::Scope prof(profile_, "gqa_attention");
  check_cache(cache);
  const int H = int(q.shape[1]), D = int(q.shape[2]);
  BELUGA_CHECK(cache.shape[2] == 2 * kv_heads * D && H % kv_heads == 0 && q.stride[2] == 1,
               "gqa_attention: shapes");
  const int group = H / kv_heads;
  const int nk = max_keys(m);
  const int64_t per_thread = int64_t(nk) * D * 2 + int64_t(kQueryBlock) * nk;
  Tensor work = scratch(DType::kF32, {threads_, per_thread});
  const int64_t tasks = int64_t(m.num_seqs) * kv_heads;
#pragma omp parallel for num_threads(threads_) schedule(dynamic)
  for (int64_t task = 0; task < tasks; ++task) {
    const int s = int(task / kv_heads), kvh = int(task % kv_heads);
    const int n = seq_keys(m, s), Tq = m.h_query_start[s + 1] - m.h_query_start[s];
    float* Kt = work.ptr<float>() + int64_t(omp_get_thread_num()) * per_thread;
    float* V = Kt + int64_t(nk) * D;
    float* S = V + int64_t(nk) * D;
    for (int j = 0; j < n; ++j) {
      const float* row = cache_row(cache, m, s, j);
      for (int d = 0; d < D; ++d) Kt[int64_t(d) * n + j] = row[kvh * D + d];
      std::memcpy(V + int64_t(j) * D, row + (kv_heads + kvh) * D, D * sizeof(float));
    }
    const int t0 = m.h_query_start[s];
    for (int g = 0; g < group; ++g) {
      const int h = kvh * group + g;
      attend(*k_, q.ptr<const float>() + t0 * q.stride[0] + h * q.stride[1], q.stride[0], Tq, D, Kt, n, V, D,
             m.h_context_len[s], scale, out.ptr<float>() + t0 * out.stride[0] + h * out.stride[1],
             out.stride[0], S);
    }
  }
}

}  // namespace beluga
