// The CPU backend's DeepSeek-V4 ops (ops.h states each contract): hyper-connection weights with
// Sinkhorn normalization, stream collapse/expand, the compressor's gated pooling, the lightning
// indexer's top-k and shared-KV attention with sinks, and hash / sqrtsoftplus routing. Plain loops in
// F32 with F64 sums: the shapes are small next to the GEMMs around them.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

namespace beluga {

namespace {

const float* frow(const Tensor& t, int64_t r) {
  return t.ptr<const float>() + r * t.stride[0];
}
float* frow_mut(const Tensor& t, int64_t r) {
  return t.ptr<float>() + r * t.stride[0];
}
// Row r, head h of a [T, H, d] tensor.
const float* fhead(const Tensor& t, int64_t r, int64_t h) {
  return t.ptr<const float>() + r * t.stride[0] + h * t.stride[1];
}
float* fhead_mut(const Tensor& t, int64_t r, int64_t h) {
  return t.ptr<float>() + r * t.stride[0] + h * t.stride[1];
}

void check_f32(const Tensor& t, const char* op, const char* what) {
  BELUGA_CHECK(t.dtype == DType::kF32 && t.stride[t.ndim - 1] == 1, op, ": ", what,
               " must be F32 with unit stride, got ", t.describe());
}

float sigmoid(float x) {
  return 1.0f / (1.0f + std::exp(-x));
}

}  // namespace

void CpuOps::hc_weights(Tensor pre, Tensor post, Tensor comb, const Tensor& mix, const Tensor& base,
                        const Tensor& scale, int iters, float eps) {
  cpu::OpProfile::Scope prof(profile_, "hc_weights");
  const int64_t T = mix.shape[0], n = pre.shape[1];
  const bool head_only = post.empty();
  check_f32(mix, "hc_weights", "mix");
  check_f32(base, "hc_weights", "base");
  check_f32(scale, "hc_weights", "scale");
  BELUGA_CHECK(mix.shape[1] == (head_only ? n : (2 + n) * n) && base.numel() == mix.shape[1] &&
                   scale.numel() == (head_only ? 1 : 3) && iters >= 1,
               "hc_weights: shapes");
  const float* b = base.ptr<const float>();
  const float* sc = scale.ptr<const float>();
  std::vector<double> c(static_cast<size_t>(n * n));
  for (int64_t t = 0; t < T; ++t) {
    const float* z = frow(mix, t);
    float* pr = frow_mut(pre, t);
    for (int64_t i = 0; i < n; ++i) pr[i] = sigmoid(z[i] * sc[0] + b[i]) + eps;
    if (head_only) continue;
    float* po = frow_mut(post, t);
    for (int64_t i = 0; i < n; ++i) po[i] = 2.0f * sigmoid(z[n + i] * sc[1] + b[n + i]);
    // comb: row-wise softmax + eps, then Sinkhorn (columns first).
    for (int64_t r = 0; r < n; ++r) {
      const float* zr = z + 2 * n + r * n;
      const float* br = b + 2 * n + r * n;
      double mx = -INFINITY;
      for (int64_t k = 0; k < n; ++k) mx = std::max(mx, double(zr[k] * sc[2] + br[k]));
      double sum = 0;
      for (int64_t k = 0; k < n; ++k)
        sum += (c[size_t(r * n + k)] = std::exp(double(zr[k] * sc[2] + br[k]) - mx));
      for (int64_t k = 0; k < n; ++k) c[size_t(r * n + k)] = c[size_t(r * n + k)] / sum + eps;
    }
    auto norm_cols = [&] {
      for (int64_t k = 0; k < n; ++k) {
        double s = 0;
        for (int64_t r = 0; r < n; ++r) s += c[size_t(r * n + k)];
        for (int64_t r = 0; r < n; ++r) c[size_t(r * n + k)] /= s + eps;
      }
    };
    auto norm_rows = [&] {
      for (int64_t r = 0; r < n; ++r) {
        double s = 0;
        for (int64_t k = 0; k < n; ++k) s += c[size_t(r * n + k)];
        for (int64_t k = 0; k < n; ++k) c[size_t(r * n + k)] /= s + eps;
      }
    };
    norm_cols();
    for (int it = 1; it < iters; ++it) {
      norm_rows();
      norm_cols();
    }
    float* co = comb.ptr<float>() + t * comb.stride[0];
    for (int64_t i = 0; i < n * n; ++i) co[i] = float(c[size_t(i)]);
  }
}

void CpuOps::hc_collapse(Tensor out, const Tensor& streams, const Tensor& pre) {
  cpu::OpProfile::Scope prof(profile_, "hc_collapse");
  const int64_t T = out.shape[0], D = out.shape[1], n = pre.shape[1];
  BELUGA_CHECK(streams.shape[0] == T && streams.shape[1] == n * D && pre.shape[0] == T,
               "hc_collapse: shapes");
  for (int64_t t = 0; t < T; ++t) {
    const float* s = frow(streams, t);
    const float* p = frow(pre, t);
    float* o = frow_mut(out, t);
    for (int64_t d = 0; d < D; ++d) {
      float acc = 0;
      for (int64_t j = 0; j < n; ++j) acc += p[j] * s[j * D + d];
      o[d] = acc;
    }
  }
}

void CpuOps::hc_expand(Tensor out, const Tensor& streams, const Tensor& post, const Tensor& comb,
                       const Tensor& y) {
  cpu::OpProfile::Scope prof(profile_, "hc_expand");
  const int64_t T = y.shape[0], D = y.shape[1], n = post.shape[1];
  BELUGA_CHECK(streams.shape[1] == n * D && out.shape[1] == n * D && comb.numel() == T * n * n &&
                   out.data != streams.data,
               "hc_expand: shapes (out must not alias streams)");
  for (int64_t t = 0; t < T; ++t) {
    const float* s = frow(streams, t);
    const float* p = frow(post, t);
    const float* c = comb.ptr<const float>() + t * comb.stride[0];
    const float* yr = frow(y, t);
    float* o = frow_mut(out, t);
    for (int64_t k = 0; k < n; ++k)
      for (int64_t d = 0; d < D; ++d) {
        float acc = p[k] * yr[d];
        for (int64_t j = 0; j < n; ++j) acc += c[j * n + k] * s[j * D + d];
        o[k * D + d] = acc;
      }
  }
}

void CpuOps::compress_pool(Tensor out, const Tensor& kv, const Tensor& gate, const Tensor& ape, int rate,
                           bool overlap) {
  cpu::OpProfile::Scope prof(profile_, "compress_pool");
  const int64_t W = out.shape[0], d = out.shape[1], width = overlap ? 2 * d : d;
  check_f32(ape, "compress_pool", "ape");
  BELUGA_CHECK(rate > 0 && kv.shape[1] == width && gate.shape[1] == width && ape.shape[0] == rate &&
                   ape.shape[1] == width && kv.shape[0] >= W * rate && gate.shape[0] == kv.shape[0],
               "compress_pool: shapes");
  std::vector<double> logit(static_cast<size_t>(2 * rate));
  std::vector<const float*> val(static_cast<size_t>(2 * rate));
  for (int64_t w = 0; w < W; ++w) {
    float* o = frow_mut(out, w);
    for (int64_t ch = 0; ch < d; ++ch) {
      int m = 0;
      if (overlap && w > 0)  // the previous window's first series
        for (int i = 0; i < rate; ++i, ++m) {
          const int64_t r = (w - 1) * rate + i;
          logit[size_t(m)] = double(frow(gate, r)[ch] + frow(ape, i)[ch]);
          val[size_t(m)] = frow(kv, r) + ch;
        }
      const int64_t off = overlap ? d : 0;  // this window's (second) series
      for (int i = 0; i < rate; ++i, ++m) {
        const int64_t r = w * rate + i;
        logit[size_t(m)] = double(frow(gate, r)[off + ch] + frow(ape, i)[off + ch]);
        val[size_t(m)] = frow(kv, r) + off + ch;
      }
      const double mx = *std::max_element(logit.begin(), logit.begin() + m);
      double sum = 0, acc = 0;
      for (int i = 0; i < m; ++i) sum += std::exp(logit[size_t(i)] - mx);
      for (int i = 0; i < m; ++i)
        acc += double(float(std::exp(logit[size_t(i)] - mx) / sum)) * *val[size_t(i)];
      o[ch] = float(acc);
    }
  }
}

void CpuOps::indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, const Tensor& weights, int rate,
                          float q_scale, float w_scale, int first_pos) {
  cpu::OpProfile::Scope prof(profile_, "indexer_topk");
  const int64_t T = q.shape[0], H = q.shape[1], d = q.shape[2], W = keys.empty() ? 0 : keys.shape[0];
  const int64_t K = ids.shape[1];
  BELUGA_CHECK(ids.dtype == DType::kI32 && ids.shape[0] == T && weights.shape[0] == T &&
                   weights.shape[1] == H && (W == 0 || keys.shape[1] == d) && rate > 0 && first_pos >= 0,
               "indexer_topk: shapes");
  // Ties (exact zeros after the ReLU are common) are broken as torch.topk's CPU kernel breaks them:
  // every entry in index order, the unseen ones at -inf, std::nth_element on the value alone.
  using Entry = std::pair<float, int>;
  std::vector<Entry> queue(static_cast<size_t>(W));
  const int64_t take = std::min(K, W);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t visible = std::min<int64_t>(W, (first_pos + t + 1) / rate);
    const float* wt = frow(weights, t);
    for (int64_t w = 0; w < W; ++w) {
      float s = -INFINITY;
      if (w < visible) {
        const float* k = frow(keys, w);
        s = 0;
        for (int64_t h = 0; h < H; ++h) {
          const float* qh = fhead(q, t, h);
          float dot = 0;
          for (int64_t i = 0; i < d; ++i) dot += qh[i] * k[i];
          s += std::max(dot, 0.0f) * q_scale * (wt[h] * w_scale);
        }
      }
      queue[size_t(w)] = {s, int(w)};
    }
    if (take > 0)
      std::nth_element(queue.begin(), queue.begin() + (take - 1), queue.end(),
                       [](const Entry& x, const Entry& y) { return x.first > y.first; });
    int32_t* o = ids.ptr<int32_t>() + t * ids.stride[0];
    for (int64_t i = 0; i < K; ++i)
      o[i] = i < take && queue[size_t(i)].second < visible ? queue[size_t(i)].second : -1;
  }
}

void CpuOps::sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp,
                            const Tensor& comp_ids, const Tensor& sinks, int window, int rate, float scale,
                            int first_pos, int kv_first) {
  cpu::OpProfile::Scope prof(profile_, "sink_attention");
  const int64_t T = q.shape[0], H = q.shape[1], D = q.shape[2], W = comp.empty() ? 0 : comp.shape[0];
  check_f32(sinks, "sink_attention", "sinks");
  const int64_t N = kv.shape[0];
  // Every query's window must lie in kv: from the first query's window start to the last query.
  BELUGA_CHECK(kv.shape[1] == D && (W == 0 || comp.shape[1] == D) && sinks.numel() == H && window > 0 &&
                   (W == 0 || rate > 0) && (comp_ids.empty() || comp_ids.dtype == DType::kI32) &&
                   kv_first >= 0 && kv_first <= std::max(0, first_pos - window + 1) &&
                   kv_first + N >= first_pos + T,
               "sink_attention: shapes");
  const int64_t K = comp_ids.empty() ? 0 : comp_ids.shape[1];
#pragma omp parallel num_threads(threads_)
  {
    std::vector<const float*> rows;
    std::vector<double> logit;
#pragma omp for schedule(dynamic)
    for (int64_t t = 0; t < T; ++t) {
      rows.clear();
      const int64_t p = first_pos + t;
      for (int64_t j = std::max<int64_t>(0, p - window + 1); j <= p; ++j)
        rows.push_back(frow(kv, j - kv_first));
      if (W > 0) {
        const int64_t visible = std::min<int64_t>(W, (p + 1) / rate);
        if (comp_ids.empty()) {
          for (int64_t w = 0; w < visible; ++w) rows.push_back(frow(comp, w));
        } else {
          const int32_t* id = comp_ids.ptr<const int32_t>() + t * comp_ids.stride[0];
          for (int64_t i = 0; i < K; ++i)
            if (id[i] >= 0) {
              BELUGA_CHECK(id[i] < visible, "sink_attention: entry ", id[i], " not visible to row ", t);
              rows.push_back(frow(comp, id[i]));
            }
        }
      }
      logit.resize(rows.size());
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = fhead(q, t, h);
        double mx = sinks.ptr<const float>()[h];
        for (size_t r = 0; r < rows.size(); ++r) {
          float dot = 0;
          for (int64_t i = 0; i < D; ++i) dot += qh[i] * rows[r][i];
          logit[r] = double(dot * scale);
          mx = std::max(mx, logit[r]);
        }
        double sum = std::exp(double(sinks.ptr<const float>()[h]) - mx);
        for (size_t r = 0; r < rows.size(); ++r) sum += (logit[r] = std::exp(logit[r] - mx));
        float* o = fhead_mut(out, t, h);
        std::fill(o, o + D, 0.0f);
        for (size_t r = 0; r < rows.size(); ++r) {
          const float p = float(logit[r] / sum);
          for (int64_t i = 0; i < D; ++i) o[i] += p * rows[r][i];
        }
      }
    }
  }
}

void CpuOps::moe_route_v4(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                          const Tensor& hash_table, const Tensor& tokens, RouterScoring scoring,
                          float scale) {
  cpu::OpProfile::Scope prof(profile_, "moe_route_v4");
  const int64_t T = logits.shape[0], E = logits.shape[1], K = ids.shape[1];
  check_f32(logits, "moe_route_v4", "logits");
  BELUGA_CHECK(ids.dtype == DType::kI32 && weights.dtype == DType::kF32 && K <= E &&
                   (bias.empty() || (bias.dtype == DType::kF32 && bias.numel() == E)),
               "moe_route_v4: shapes");
  const bool hashed = !hash_table.empty();
  if (hashed)
    BELUGA_CHECK(hash_table.dtype == DType::kI32 && hash_table.shape[1] == K && tokens.dtype == DType::kI32 &&
                     tokens.numel() == T,
                 "moe_route_v4: hash table I32 [vocab, k] and tokens I32 [T]");
  std::vector<float> s(static_cast<size_t>(E));
  std::vector<int> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    const float* z = frow(logits, t);
    if (scoring == RouterScoring::kSoftmax) {
      const float mx = *std::max_element(z, z + E);
      double sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += std::exp(double(z[e] - mx));
      for (int64_t e = 0; e < E; ++e) s[size_t(e)] = float(std::exp(double(z[e] - mx)) / sum);
    } else if (scoring == RouterScoring::kSigmoid) {
      for (int64_t e = 0; e < E; ++e) s[size_t(e)] = sigmoid(z[e]);
    } else {  // sqrt(softplus(z)), softplus as torch: z itself above 20
      for (int64_t e = 0; e < E; ++e)
        s[size_t(e)] = std::sqrt(z[e] > 20.0f ? z[e] : float(std::log1p(std::exp(double(z[e])))));
    }
    int32_t* id = ids.ptr<int32_t>() + t * ids.stride[0];
    if (hashed) {
      const int32_t tok = tokens.ptr<const int32_t>()[t];
      BELUGA_CHECK(tok >= 0 && tok < hash_table.shape[0], "moe_route_v4: token ", tok,
                   " outside the hash table");
      const int32_t* row = hash_table.ptr<const int32_t>() + int64_t(tok) * hash_table.stride[0];
      for (int64_t i = 0; i < K; ++i) {
        BELUGA_CHECK(row[i] >= 0 && row[i] < E, "moe_route_v4: hash table names expert ", row[i]);
        id[i] = row[i];
      }
    } else {
      std::iota(order.begin(), order.end(), 0);
      auto sel = [&](int e) { return s[size_t(e)] + (bias.empty() ? 0.0f : bias.ptr<const float>()[e]); };
      std::partial_sort(order.begin(), order.begin() + K, order.end(),
                        [&](int a, int b) { return sel(a) > sel(b) || (sel(a) == sel(b) && a < b); });
      for (int64_t i = 0; i < K; ++i) id[i] = order[size_t(i)];
    }
    float sum = 0;
    for (int64_t i = 0; i < K; ++i) sum += s[size_t(id[i])];
    float* wt = weights.ptr<float>() + t * weights.stride[0];
    for (int64_t i = 0; i < K; ++i) wt[i] = s[size_t(id[i])] / (sum + 1e-20f) * scale;
  }
}

}  // namespace beluga
