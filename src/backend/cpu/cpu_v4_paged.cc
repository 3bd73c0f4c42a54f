// The CPU backend's DeepSeek-V4 step ops over the paged hybrid cache (ops.h: v4_compress,
// v4_indexer_topk, v4_sink_attention): sequence by sequence, the rows a sequence reads are copied out
// of the cache into contiguous buffers and handed to the single-sequence ops (compress_pool,
// indexer_topk, sink_attention), exactly as the model did before these ops existed, so the golden
// tests judge the same arithmetic. Cache tensors are host memory here, addressed from the host block
// tables (AttnMeta::h_*).
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

namespace beluga {

namespace {

// One sequence of the step, and where its tokens and entries live in the paged cache.
struct SeqRows {
  const int32_t* table;
  int ctx, q0, qn;  // cached tokens, first row in the step, rows in the step
  int bs;           // tokens per block
  int64_t token(int64_t p) const { return int64_t(table[p / bs]) * bs + p % bs; }
  int64_t entry(int64_t e, int rate, int per_block) const {
    return int64_t(table[((e + 1) * rate - 1) / bs]) * per_block + e % per_block;
  }
  int64_t end() const { return ctx + qn; }
};

SeqRows seq_rows(const AttnMeta& m, int s) {
  BELUGA_CHECK(int64_t(m.h_block_table.size()) == int64_t(m.num_seqs) * m.max_blocks &&
                   int(m.h_query_start.size()) == m.num_seqs + 1 && int(m.h_context_len.size()) == m.num_seqs,
               "deepseek_v4: the step has no host block tables");
  const int q0 = m.h_query_start[size_t(s)];
  return {m.h_block_table.data() + size_t(s) * size_t(m.max_blocks), m.h_context_len[size_t(s)], q0,
          m.h_query_start[size_t(s) + 1] - q0, m.block_size};
}

// Rows `rows` of the F32 matrix src copied into `buf`, as a contiguous [rows, src cols] tensor.
Tensor gather(std::vector<float>& buf, const Tensor& src, const std::vector<int64_t>& rows) {
  const int64_t w = src.shape[1];
  buf.resize(rows.size() * size_t(w));
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(buf.data() + i * size_t(w), src.ptr<const float>() + rows[i] * src.stride[0],
                size_t(w) * sizeof(float));
  return Tensor::make(buf.data(), DType::kF32, {int64_t(rows.size()), w});
}

// [T, w] seen as [T, 1, w] (rope rotates heads).
Tensor one_head(const Tensor& t) {
  Tensor r = t;
  r.ndim = 3;
  r.shape = {t.shape[0], 1, t.shape[1], 0};
  r.stride = {t.stride[0], t.shape[1], 1, 0};
  return r;
}

void check_paged(const Tensor& t, const char* what) {
  BELUGA_CHECK(t.dtype == DType::kF32 && t.ndim == 2 && t.stride[1] == 1, "deepseek_v4: ", what,
               " must be an F32 [rows, cols] view of the cache, got ", t.describe());
}

}  // namespace

void CpuOps::v4_compress(Tensor entries, int per_block, const Tensor& proj, const Tensor& ape,
                         const Tensor& norm, float eps, const RopeTable& rope, int rate, bool overlap,
                         const AttnMeta& m) {
  check_paged(entries, "entries");
  check_paged(proj, "projections");
  const int64_t d = entries.shape[1], width = overlap ? 2 * d : d;
  BELUGA_CHECK(proj.shape[1] == 2 * width && rate > 0 && per_block > 0 && rope.rotary_dim <= d,
               "v4_compress: shapes");
  std::vector<float> buf, pooled_buf;
  std::vector<int64_t> rows;
  std::vector<int32_t> at;
  for (int s = 0; s < m.num_seqs; ++s) {
    const SeqRows q = seq_rows(m, s);
    // The windows this step completes, [w0, w1); with overlap, window w0 - 1's rows are read too.
    const int64_t w0 = q.ctx / rate, w1 = q.end() / rate;
    if (w1 <= w0) continue;
    const int64_t ws = overlap ? std::max<int64_t>(0, w0 - 1) : w0;
    rows.clear();
    for (int64_t p = ws * rate; p < w1 * rate; ++p) rows.push_back(q.token(p));
    const Tensor src = gather(buf, proj, rows);
    pooled_buf.assign(size_t((w1 - ws) * d), 0.0f);
    const Tensor pooled = Tensor::make(pooled_buf.data(), DType::kF32, {w1 - ws, d});
    compress_pool(pooled, src.cols(0, width), src.cols(width, 2 * width), ape, rate, overlap);
    const Tensor out = pooled.rows(w0 - ws, w1 - ws);
    rmsnorm(out, out, norm, eps);
    at.clear();
    for (int64_t e = w0; e < w1; ++e) at.push_back(int32_t(e * rate));
    this->rope(one_head(out).cols(d - rope.rotary_dim, d),
               Tensor::make(at.data(), DType::kI32, {int64_t(at.size())}), rope);
    for (int64_t e = w0; e < w1; ++e) {
      const int64_t row = q.q0 + ((e + 1) * rate - 1 - q.ctx);  // the step row completing it
      if (m.slot_mapping && m.slot_mapping[row] < 0) continue;
      std::memcpy(entries.ptr<float>() + q.entry(e, rate, per_block) * entries.stride[0],
                  out.ptr<const float>() + (e - w0) * d, size_t(d) * sizeof(float));
    }
  }
}

void CpuOps::v4_indexer_topk(Tensor ids, const Tensor& q, const Tensor& keys, int per_block,
                             const Tensor& weights, int rate, float q_scale, float w_scale,
                             const AttnMeta& m) {
  check_paged(keys, "indexer keys");
  BELUGA_CHECK(ids.shape[0] == m.num_tokens && q.shape[0] == m.num_tokens && rate > 0 && per_block > 0,
               "v4_indexer_topk: shapes");
  std::vector<float> buf;
  std::vector<int64_t> rows;
  for (int s = 0; s < m.num_seqs; ++s) {
    const SeqRows sq = seq_rows(m, s);
    const int64_t W = sq.end() / rate;
    rows.clear();
    for (int64_t e = 0; e < W; ++e) rows.push_back(sq.entry(e, rate, per_block));
    const Tensor k = W > 0 ? gather(buf, keys, rows) : Tensor{};
    indexer_topk(ids.rows(sq.q0, sq.q0 + sq.qn), q.rows(sq.q0, sq.q0 + sq.qn), k,
                 weights.rows(sq.q0, sq.q0 + sq.qn), rate, q_scale, w_scale, sq.ctx);
  }
}

void CpuOps::v4_sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp,
                               int per_block, const Tensor& comp_ids, const Tensor& sinks, int window,
                               int rate, float scale, const AttnMeta& m) {
  check_paged(kv, "window rows");
  if (!comp.empty()) check_paged(comp, "entries");
  BELUGA_CHECK(out.shape[0] == m.num_tokens && q.shape[0] == m.num_tokens && window > 0 &&
                   (comp.empty() || (rate > 0 && per_block > 0)),
               "v4_sink_attention: shapes");
  std::vector<float> win_buf, comp_buf;
  std::vector<int64_t> rows;
  for (int s = 0; s < m.num_seqs; ++s) {
    const SeqRows sq = seq_rows(m, s);
    const int64_t k0 = std::max<int64_t>(0, sq.ctx - window + 1);
    rows.clear();
    for (int64_t p = k0; p < sq.end(); ++p) rows.push_back(sq.token(p));
    const Tensor win = gather(win_buf, kv, rows);
    Tensor c;
    const int64_t W = comp.empty() ? 0 : sq.end() / rate;
    if (W > 0) {
      rows.clear();
      for (int64_t e = 0; e < W; ++e) rows.push_back(sq.entry(e, rate, per_block));
      c = gather(comp_buf, comp, rows);
    }
    sink_attention(out.rows(sq.q0, sq.q0 + sq.qn), q.rows(sq.q0, sq.q0 + sq.qn), win, c,
                   c.empty() || comp_ids.empty() ? Tensor{} : comp_ids.rows(sq.q0, sq.q0 + sq.qn), sinks,
                   window, rate, scale, sq.ctx, int(k0));
  }
}

}  // namespace beluga
