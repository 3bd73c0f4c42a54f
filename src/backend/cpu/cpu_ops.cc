#include "backend/cpu/cpu_ops.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"

namespace beluga {

namespace {

constexpr size_t kAlign = 64;

inline size_t align_up(size_t n) {
  return (n + kAlign - 1) & ~(kAlign - 1);
}

inline unsigned char* aligned(unsigned char* p) {
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(p) + kAlign - 1) &
                                          ~uintptr_t(kAlign - 1));
}

// Reads element i of a 1-D F32 or BF16 tensor (norm weights, biases).
inline float elem(const Tensor& t, int64_t i) {
  return t.dtype == DType::kF32 ? t.ptr<const float>()[i] : bf16_to_f32(t.ptr<const uint16_t>()[i]);
}

inline float* row_f32(const Tensor& t, int64_t r) {
  return t.ptr<float>() + r * t.stride[0];
}

void check_f32_2d(const Tensor& t, const char* what) {
  BELUGA_CHECK(t.dtype == DType::kF32 && t.ndim == 2 && t.stride[1] == 1, what,
               " must be a row-major F32 matrix, got ", t.describe());
}

}  // namespace

CpuOps::CpuOps(CpuOptions opt)
    : k_(&cpu::select_kernels()), bf16_act_(opt.bf16_activations), deterministic_(opt.deterministic) {
  threads_ = opt.threads > 0 ? opt.threads : omp_get_max_threads();
#ifdef BELUGA_TSAN
  threads_ = 1;  // libgomp's synchronization is invisible to ThreadSanitizer (CMakeLists.txt)
#endif
}

CpuOps::~CpuOps() = default;

Tensor CpuOps::scratch(DType dtype, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  size_t bytes = align_up(size_t(std::max<int64_t>(n, 1)) * dtype_size(dtype));
  if (chunks_.empty() || used_ + bytes > chunk_size_.back()) {
    size_t size = std::max(bytes, chunks_.empty() ? size_t(1) << 20 : chunk_size_.back() * 2);
    chunks_.push_back(std::make_unique_for_overwrite<unsigned char[]>(size + kAlign));  // no zero-fill
    chunk_size_.push_back(size);
    used_ = 0;
  }
  unsigned char* p = aligned(chunks_.back().get()) + used_;
  used_ += bytes;
  return Tensor::make(p, dtype, shape.begin(), int(shape.size()));
}

void CpuOps::reset_scratch() {
  if (chunks_.size() > 1) {
    size_t total = 0;
    for (size_t s : chunk_size_) total += s;
    chunks_.clear();
    chunk_size_.clear();
    chunks_.push_back(std::make_unique_for_overwrite<unsigned char[]>(total + kAlign));
    chunk_size_.push_back(total);
  }
  used_ = 0;
}

Tensor CpuOps::alloc_persistent(DType dtype, std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  size_t bytes = size_t(std::max<int64_t>(n, 1)) * dtype_size(dtype);
  auto buf = std::make_unique_for_overwrite<unsigned char[]>(bytes + kAlign);
  unsigned char* p = aligned(buf.get());
  std::memset(p, 0, bytes);
  persistent_.push_back(std::move(buf));
  return Tensor::make(p, dtype, shape.begin(), int(shape.size()));
}

void CpuOps::copy_to_host(const Tensor& src, void* dst) {
  BELUGA_ASSERT(src.is_contiguous());
  std::memcpy(dst, src.data, src.nbytes());
}

void CpuOps::copy_from_host(Tensor dst, const void* src) {
  BELUGA_ASSERT(dst.is_contiguous());
  std::memcpy(dst.data, src, dst.nbytes());
}

void CpuOps::embedding(Tensor out, const Tensor& table, const Tensor& ids) {
  cpu::OpProfile::Scope prof(profile_, "embedding");
  const int64_t T = ids.numel(), D = table.shape[1], V = table.shape[0];
  const int32_t* id = ids.ptr<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    BELUGA_CHECK(id[t] >= 0 && id[t] < V, "token id ", id[t], " outside the vocabulary (", V, ")");
    float* o = row_f32(out, t);
    if (table.dtype == DType::kF32) {
      std::memcpy(o, table.ptr<const float>() + id[t] * table.stride[0], D * sizeof(float));
    } else {
      const uint16_t* r = table.ptr<const uint16_t>() + id[t] * table.stride[0];
      for (int64_t d = 0; d < D; ++d) o[d] = bf16_to_f32(r[d]);
    }
  }
}

void CpuOps::rmsnorm(Tensor out, const Tensor& x, const Tensor& w, float eps) {
  cpu::OpProfile::Scope prof(profile_, "rmsnorm");
  const int64_t R = x.shape[0], D = x.shape[1];
#pragma omp parallel for num_threads(threads_) if (R * D > 65536)
  for (int64_t r = 0; r < R; ++r) {
    const float* xi = row_f32(x, r);
    float* o = row_f32(out, r);
    double ss = 0;
    for (int64_t d = 0; d < D; ++d) ss += double(xi[d]) * xi[d];
    const float inv = 1.0f / std::sqrt(float(ss / double(D)) + eps);
    for (int64_t d = 0; d < D; ++d) o[d] = elem(w, d) * (xi[d] * inv);
  }
}

void CpuOps::add_rmsnorm(Tensor residual, const Tensor& x, Tensor out, const Tensor& w, float eps) {
  const int64_t R = x.shape[0], D = x.shape[1];
  for (int64_t r = 0; r < R; ++r) {
    float* res = row_f32(residual, r);
    const float* xi = row_f32(x, r);
    for (int64_t d = 0; d < D; ++d) res[d] += xi[d];
  }
  rmsnorm(out, residual, w, eps);
}

void CpuOps::add(Tensor out, const Tensor& a, const Tensor& b) {
  cpu::OpProfile::Scope prof(profile_, "add");
  const int64_t R = a.shape[0], D = a.shape[1];
  for (int64_t r = 0; r < R; ++r) {
    float* o = row_f32(out, r);
    const float* x = row_f32(a, r);
    const float* y = row_f32(b, r);
    for (int64_t d = 0; d < D; ++d) o[d] = x[d] + y[d];
  }
}

void CpuOps::copy(Tensor out, const Tensor& x) {
  cpu::OpProfile::Scope prof(profile_, "copy");
  // F32, or I32 ids (4 bytes either way: copied as they are).
  BELUGA_ASSERT(out.ndim == x.ndim && out.dtype == x.dtype &&
                (x.dtype == DType::kF32 || x.dtype == DType::kI32));
  // Collapses to at most 3 leading loops over a contiguous last dimension.
  const int nd = x.ndim;
  int64_t s0 = nd >= 3 ? x.shape[nd - 3] : 1, s1 = nd >= 2 ? x.shape[nd - 2] : 1, D = x.shape[nd - 1];
  for (int64_t i = 0; i < s0; ++i)
    for (int64_t j = 0; j < s1; ++j) {
      const float* src =
          x.ptr<const float>() + (nd >= 3 ? i * x.stride[nd - 3] : 0) + (nd >= 2 ? j * x.stride[nd - 2] : 0);
      float* dst =
          out.ptr<float>() + (nd >= 3 ? i * out.stride[nd - 3] : 0) + (nd >= 2 ? j * out.stride[nd - 2] : 0);
      std::memcpy(dst, src, D * sizeof(float));
    }
}

void CpuOps::silu_mul(Tensor out, const Tensor& gate_up) {
  cpu::OpProfile::Scope prof(profile_, "silu_mul");
  const int64_t R = out.shape[0], I = out.shape[1];
  for (int64_t r = 0; r < R; ++r) {
    const float* g = row_f32(gate_up, r);
    k_->silu_mul(g, g + I, row_f32(out, r), int(I));
  }
}

void CpuOps::rope(Tensor x, const Tensor& positions, const RopeTable& tab) {
  cpu::OpProfile::Scope prof(profile_, "rope");
  const int64_t T = x.shape[0], H = x.shape[1];
  const int half = tab.rotary_dim / 2;
  const int32_t* pos = positions.ptr<const int32_t>();
  const int64_t max_pos = tab.cos.shape[0];
  for (int64_t t = 0; t < T; ++t) {
    BELUGA_CHECK(pos[t] >= 0 && pos[t] < max_pos, "position ", pos[t], " beyond the rope table (", max_pos,
                 ")");
    const float* c = tab.cos.ptr<const float>() + int64_t(pos[t]) * half;
    const float* s = tab.sin.ptr<const float>() + int64_t(pos[t]) * half;
    for (int64_t h = 0; h < H; ++h) {
      float* v = x.ptr<float>() + t * x.stride[0] + h * x.stride[1];
      for (int i = 0; i < half; ++i) {
        float* a = tab.interleaved ? v + 2 * i : v + i;
        float* b = tab.interleaved ? v + 2 * i + 1 : v + i + half;
        const float x0 = *a, x1 = *b;
        *a = x0 * c[i] - x1 * s[i];
        *b = x1 * c[i] + x0 * s[i];
      }
    }
  }
}

void CpuOps::gather_ids(Tensor out, const Tensor& ids, const Tensor& rows) {
  BELUGA_CHECK(out.dtype == DType::kI32 && ids.dtype == DType::kI32 && rows.dtype == DType::kI32 &&
                   out.is_contiguous() && ids.is_contiguous() && rows.is_contiguous() &&
                   out.numel() == rows.numel(),
               "gather_ids: out I32 [R], ids I32 [N], rows I32 [R]");
  for (int64_t r = 0; r < rows.numel(); ++r) {
    const int32_t at = rows.ptr<const int32_t>()[r];
    BELUGA_CHECK(at >= 0 && at < ids.numel(), "gather_ids: row ", at, " of ", ids.numel());
    out.ptr<int32_t>()[r] = ids.ptr<const int32_t>()[at];
  }
}

void CpuOps::argmax_rows(Tensor ids, const Tensor& logits, Tensor probs) {
  BELUGA_CHECK(ids.dtype == DType::kI32 && logits.dtype == DType::kF32 && logits.ndim == 2 &&
                   logits.stride[1] == 1 && ids.numel() == logits.shape[0] &&
                   (probs.empty() || (probs.dtype == DType::kF32 && probs.numel() == logits.shape[0])),
               "argmax_rows: ids I32 [R], logits F32 [R, V], probs F32 [R] or none");
  const int64_t V = logits.shape[1];
  for (int64_t r = 0; r < logits.shape[0]; ++r) {
    const float* row = logits.ptr<const float>() + r * logits.stride[0];
    const float* best = std::max_element(row, row + V);
    ids.ptr<int32_t>()[r] = int32_t(best - row);
    if (probs.empty()) continue;
    double sum = 0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(row[v]) - double(*best));
    probs.ptr<float>()[r] = float(1.0 / sum);
  }
}

void CpuOps::gather_rows(Tensor out, const Tensor& x, const Tensor& rows) {
  cpu::OpProfile::Scope prof(profile_, "gather_rows");
  const int64_t D = x.shape[1];
  const int32_t* r = rows.ptr<const int32_t>();
  for (int64_t i = 0; i < rows.numel(); ++i)
    std::memcpy(row_f32(out, i), row_f32(x, r[i]), D * sizeof(float));
}

namespace {

cpu::GemmArgs gemm_args(const Weight& w, const float* x, int64_t ldx, const uint16_t* xb, int64_t ldxb, int M,
                        float* out, int64_t ldo, const uint16_t* xs = nullptr) {
  cpu::GemmArgs a{};
  a.x = x;
  a.ldx = ldx;
  a.M = M;
  a.K = int(w.in_features());
  a.w = w.w.data;
  a.wtype = w.w.dtype;
  a.ldw = w.w.stride[0];
  a.out = out;
  a.ldo = ldo;
  if (w.w.dtype == DType::kF8E4M3) {
    BELUGA_CHECK(!w.scale.empty(), "FP8 weight without weight_scale_inv");
    // The vector kernels scale 16 consecutive inputs at once (checkpoints use 128-wide blocks).
    BELUGA_CHECK(w.block_k % 16 == 0, "FP8 scale blocks must span a multiple of 16 inputs, got ", w.block_k);
    a.scale = w.scale.ptr<const float>();
    a.lds = w.scale.stride[0];
    a.bn = w.block_n;
    a.bk = w.block_k;
  }
  if (w.w.dtype == DType::kBF16 && xb) {
    a.xb = xb;
    a.ldxb = ldxb;
  }
  if (w.w.dtype == DType::kBF16 && xs) a.xs = xs;
  return a;
}

}  // namespace

const uint16_t* CpuOps::maybe_bf16(const float* x, int64_t ldx, int M, int K) {
  if (!bf16_act_) return nullptr;
  Tensor xb = scratch(DType::kBF16, {M, K});
#pragma omp parallel for num_threads(threads_) if (int64_t(M) * K > (1 << 16))
  for (int m = 0; m < M; ++m) k_->to_bf16(x + int64_t(m) * ldx, xb.ptr<uint16_t>() + int64_t(m) * K, K);
  return xb.ptr<const uint16_t>();
}

const uint16_t* CpuOps::maybe_split(const float* x, int64_t ldx, int M, int K, int max_rows) {
  // Deterministic: never, so a row rounds the same at M = 1 as inside a batch or a prefill chunk.
  if (bf16_act_ || deterministic_ || !k_->split_exact || M > max_rows) return nullptr;
  Tensor xs = scratch(DType::kBF16, {M, 3 * int64_t(K)});
  for (int m = 0; m < M; ++m)
    k_->split_bf16x3(x + int64_t(m) * ldx, xs.ptr<uint16_t>() + int64_t(m) * 3 * K, K);
  return xs.ptr<const uint16_t>();
}

void CpuOps::gemm(float* out, int64_t ldo, const float* x, int64_t ldx, int M, int K, const Weight& w,
                  int N) {
  const bool bf16w = w.w.dtype == DType::kBF16;
  const uint16_t* xb = bf16w ? maybe_bf16(x, ldx, M, K) : nullptr;
  const uint16_t* xs = bf16w ? maybe_split(x, ldx, M, K) : nullptr;
  const cpu::GemmArgs a = gemm_args(w, x, ldx, xb, K, M, out, ldo, xs);
  // Small products are not worth waking the other threads.
  const int nt = (int64_t(M) * N * K < (1 << 16)) ? 1 : std::min(threads_, std::max(1, N / 4));
  if (nt == 1) {
    k_->gemm(a, 0, N);
    return;
  }
  // Column blocks handed out dynamically: a thread the OS delays (other processes, the server's own
  // threads) leaves its share to the others instead of stalling the step.
  const int chunk = std::max(16, ((N + 4 * nt - 1) / (4 * nt) + 3) & ~3);
  const int chunks = (N + chunk - 1) / chunk;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (int c = 0; c < chunks; ++c) k_->gemm(a, c * chunk, std::min(N, (c + 1) * chunk));
}

void CpuOps::linear(Tensor out, const Tensor& x, const Weight& w) {
  cpu::OpProfile::Scope prof(profile_, "linear");
  check_f32_2d(x, "linear input");
  check_f32_2d(out, "linear output");
  const int M = int(x.shape[0]), K = int(x.shape[1]), N = int(w.out_features());
  BELUGA_CHECK(w.in_features() == K && out.shape[1] == N && out.shape[0] == M, "linear: shapes ",
               x.describe(), " x ", w.w.describe(), " -> ", out.describe());
  BELUGA_ASSERT(w.w.stride[1] == 1);
  if (M == 0) return;
  gemm(out.ptr<float>(), out.stride[0], x.ptr<const float>(), x.stride[0], M, K, w, N);
  if (!w.bias.empty())
    for (int m = 0; m < M; ++m) {
      float* o = row_f32(out, m);
      for (int n = 0; n < N; ++n) o[n] += elem(w.bias, n);
    }
}

void CpuOps::linear_heads(Tensor out, const Tensor& x, const Tensor& w) {
  cpu::OpProfile::Scope prof(profile_, "linear_heads");
  const int64_t T = x.shape[0], H = x.shape[1], K = x.shape[2], N = w.shape[1];
  BELUGA_CHECK(w.ndim == 3 && w.shape[0] == H && w.shape[2] == K && w.stride[2] == 1 && out.shape[2] == N &&
                   x.stride[2] == 1 && out.stride[2] == 1,
               "linear_heads: shapes ", x.describe(), " x ", w.describe(), " -> ", out.describe());
  if (T == 0) return;
#pragma omp parallel for num_threads(threads_) schedule(dynamic)
  for (int64_t h = 0; h < H; ++h) {
    cpu::GemmArgs a{};
    a.x = x.ptr<const float>() + h * x.stride[1];
    a.ldx = x.stride[0];
    a.M = int(T);
    a.K = int(K);
    a.w = static_cast<const char*>(w.data) + h * w.stride[0] * int64_t(dtype_size(w.dtype));
    a.wtype = w.dtype;
    a.ldw = w.stride[1];
    a.out = out.ptr<float>() + h * out.stride[1];
    a.ldo = out.stride[0];
    k_->gemm(a, 0, int(N));
  }
}

void CpuOps::moe_route(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                       const RouterParams& p) {
  cpu::OpProfile::Scope prof(profile_, "moe_route");
  const int64_t T = logits.shape[0], E = logits.shape[1];
  const int K = p.top_k, G = p.n_group;
  BELUGA_CHECK(E % G == 0 && p.topk_group <= G && K <= E, "moe_route: bad router parameters");
  BELUGA_CHECK(p.scoring != RouterScoring::kSqrtSoftplus,
               "moe_route: sqrtsoftplus scoring is moe_route_v4's");
  std::vector<float> s(E), sel(E), gscore(G);
  std::vector<int> order(std::max<int64_t>(E, G));
  for (int64_t t = 0; t < T; ++t) {
    const float* z = row_f32(logits, t);
    if (p.scoring == RouterScoring::kSoftmax) {
      float mx = *std::max_element(z, z + E);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (s[e] = std::exp(z[e] - mx));
      for (int64_t e = 0; e < E; ++e) s[e] = float(s[e] / sum);
    } else {
      for (int64_t e = 0; e < E; ++e) s[e] = 1.0f / (1.0f + std::exp(-z[e]));
    }
    // Selection uses the biased scores; the weights are the unbiased ones.
    for (int64_t e = 0; e < E; ++e) sel[e] = s[e] + (bias.empty() ? 0.0f : elem(bias, e));
    if (G > 1) {
      const int per = int(E / G);
      for (int g = 0; g < G; ++g) {
        const float* b = sel.data() + g * per;
        if (p.group_by_top2_sum) {
          float m1 = -INFINITY, m2 = -INFINITY;
          for (int i = 0; i < per; ++i) {
            if (b[i] > m1) {
              m2 = m1;
              m1 = b[i];
            } else if (b[i] > m2) {
              m2 = b[i];
            }
          }
          gscore[g] = per > 1 ? m1 + m2 : m1;
        } else {
          gscore[g] = *std::max_element(b, b + per);
        }
      }
      for (int g = 0; g < G; ++g) order[g] = g;
      std::partial_sort(order.begin(), order.begin() + p.topk_group, order.begin() + G, [&](int a, int b) {
        return gscore[a] > gscore[b] || (gscore[a] == gscore[b] && a < b);
      });
      std::vector<bool> keep(G, false);
      for (int i = 0; i < p.topk_group; ++i) keep[order[i]] = true;
      for (int64_t e = 0; e < E; ++e)
        if (!keep[e / per]) sel[e] = -INFINITY;
    }
    for (int64_t e = 0; e < E; ++e) order[e] = int(e);
    std::partial_sort(order.begin(), order.begin() + K, order.begin() + E,
                      [&](int a, int b) { return sel[a] > sel[b] || (sel[a] == sel[b] && a < b); });
    float sum = 0;
    for (int i = 0; i < K; ++i) sum += s[order[i]];
    for (int i = 0; i < K; ++i) {
      float w = s[order[i]];
      if (p.norm_topk_prob) w /= (sum + 1e-20f);
      ids.ptr<int32_t>()[t * K + i] = order[i];
      weights.ptr<float>()[t * K + i] = w * p.routed_scaling_factor;
    }
  }
}

void CpuOps::moe_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                         std::span<const ExpertWeights> experts, const ExpertWeights* shared) {
  cpu::OpProfile::Scope prof(profile_, "moe_experts");
  const int64_t T = x.shape[0], D = x.shape[1], K = ids.shape[1];
  const int E = int(experts.size());
  const int NE = E + (shared ? 1 : 0);  // the shared expert runs as expert E over every token
  // Rows grouped by expert: row r of expert e is entry[start[e] + r] (token = entry / K; entry >= T*K:
  // the shared expert's token entry - T*K).
  std::vector<int> start(NE + 1, 0);
  const int32_t* id = ids.ptr<const int32_t>();
  for (int64_t i = 0; i < T * K; ++i) {
    BELUGA_ASSERT(id[i] >= 0 && id[i] < E);
    start[id[i] + 1]++;
  }
  if (shared) start[E + 1] = int(T);
  for (int e = 0; e < NE; ++e) start[e + 1] += start[e];
  const int R = start[NE];
  std::vector<int> fill(start.begin(), start.end() - 1), entry(R);
  for (int64_t i = 0; i < T * K; ++i) entry[fill[id[i]]++] = int(i);
  if (shared)
    for (int64_t t = 0; t < T; ++t) entry[fill[E]++] = int(T * K + t);
  auto expert = [&](int e) -> const ExpertWeights& { return e < E ? experts[e] : *shared; };
  auto token_of = [&](int ent) { return ent < T * K ? ent / K : ent - int(T * K); };

  int64_t I_max = 0;
  for (int e = 0; e < NE; ++e)
    if (start[e + 1] > start[e]) I_max = std::max(I_max, expert(e).gate.out_features());
  Tensor X = scratch(DType::kF32, {std::max(R, 1), D});
  Tensor G = scratch(DType::kF32, {std::max(R, 1), 2 * I_max});
  Tensor Hh = scratch(DType::kF32, {std::max(R, 1), I_max});
  Tensor Y = scratch(DType::kF32, {std::max(R, 1), D});
  const bool big = int64_t(R) * D > (1 << 16);
#pragma omp parallel for num_threads(threads_) if (big)
  for (int r = 0; r < R; ++r) std::memcpy(row_f32(X, r), row_f32(x, token_of(entry[r])), D * sizeof(float));
  const uint16_t* Xb = maybe_bf16(X.ptr<const float>(), D, R, int(D));
  // Experts see few rows each at decode; split all rows once and let each expert with few rows use it.
  const uint16_t* Xs = maybe_split(X.ptr<const float>(), D, R, int(D), 1024);

  // Work items: (expert, block of output columns), so all experts share one parallel region per GEMM
  // phase and every thread stays busy whether a step has one token or thousands.
  constexpr int kCols = 64;
  struct Item {
    int e, n0, n1;
  };
  std::vector<Item> items;
  auto make_items = [&](bool down) {
    items.clear();
    for (int e = 0; e < NE; ++e) {
      if (start[e + 1] == start[e]) continue;
      const int N = int(down ? D : expert(e).gate.out_features());
      for (int n0 = 0; n0 < N; n0 += kCols) items.push_back({e, n0, std::min(N, n0 + kCols)});
    }
  };
  make_items(false);
#pragma omp parallel for num_threads(threads_) schedule(dynamic)
  for (size_t it = 0; it < items.size(); ++it) {
    const Item w = items[it];
    const ExpertWeights& ex = expert(w.e);
    const int I = int(ex.gate.out_features()), r0 = start[w.e], n = start[w.e + 1] - r0;
    const float* xr = X.ptr<const float>() + int64_t(r0) * D;
    const uint16_t* xbr = Xb ? Xb + int64_t(r0) * D : nullptr;
    const uint16_t* xsr = Xs && n <= kSplitMaxRows ? Xs + int64_t(r0) * 3 * D : nullptr;
    float* g = G.ptr<float>() + int64_t(r0) * G.stride[0];
    k_->gemm(gemm_args(ex.gate, xr, D, xbr, D, n, g, G.stride[0], xsr), w.n0, w.n1);
    k_->gemm(gemm_args(ex.up, xr, D, xbr, D, n, g + I, G.stride[0], xsr), w.n0, w.n1);
    for (int r = 0; r < n; ++r) {
      float* gr = g + int64_t(r) * G.stride[0];
      float* hr = Hh.ptr<float>() + int64_t(r0 + r) * Hh.stride[0];
      if (const float lim = ex.swiglu_limit; lim > 0)
        for (int i = w.n0; i < w.n1; ++i) {
          gr[i] = std::min(gr[i], lim);
          gr[I + i] = std::clamp(gr[I + i], -lim, lim);
        }
      k_->silu_mul(gr + w.n0, gr + I + w.n0, hr + w.n0, w.n1 - w.n0);
    }
  }
  make_items(true);
  // BF16 copies of each expert's hidden rows, when activations are rounded.
  std::vector<const uint16_t*> hb(NE, nullptr), hs(NE, nullptr);
  for (int e = 0; e < NE; ++e)
    if (start[e + 1] > start[e]) {
      const int I = int(expert(e).gate.out_features());
      const float* h = Hh.ptr<const float>() + int64_t(start[e]) * Hh.stride[0];
      hb[e] = maybe_bf16(h, Hh.stride[0], start[e + 1] - start[e], I);
      hs[e] = maybe_split(h, Hh.stride[0], start[e + 1] - start[e], I);
    }
#pragma omp parallel for num_threads(threads_) schedule(dynamic)
  for (size_t it = 0; it < items.size(); ++it) {
    const Item w = items[it];
    const ExpertWeights& ex = expert(w.e);
    const int I = int(ex.gate.out_features()), r0 = start[w.e], n = start[w.e + 1] - r0;
    k_->gemm(gemm_args(ex.down, Hh.ptr<const float>() + int64_t(r0) * Hh.stride[0], Hh.stride[0], hb[w.e], I,
                       n, Y.ptr<float>() + int64_t(r0) * D, D, hs[w.e]),
             w.n0, w.n1);
  }
  // Each token sums its own rows (k routed + the shared one), so tokens can go in parallel.
  std::vector<int> row_of(static_cast<size_t>(R));
  for (int r = 0; r < R; ++r) row_of[size_t(entry[r])] = r;
#pragma omp parallel for num_threads(threads_) if (big)
  for (int64_t t = 0; t < T; ++t) {
    float* o = row_f32(out, t);
    std::memset(o, 0, D * sizeof(float));
    for (int64_t i = 0; i < K; ++i) {
      const int ent = int(t * K + i);
      k_->axpy(weights.ptr<const float>()[ent], Y.ptr<const float>() + int64_t(row_of[size_t(ent)]) * D, o,
               int(D));
    }
    if (shared) k_->axpy(1.0f, Y.ptr<const float>() + int64_t(row_of[size_t(T * K + t)]) * D, o, int(D));
  }
}

}  // namespace beluga
