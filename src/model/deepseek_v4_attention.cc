#include "model/deepseek_v4_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/batch.h"
#include "model/layers.h"
#include "util/error.h"

namespace beluga {

namespace {

V4Compressor load_compressor(const std::string& p, int rate, int64_t d, bool overlap, int64_t D,
                             const V4Loaders& load) {
  const int64_t width = overlap ? 2 * d : d;
  V4Compressor c;
  c.wkv = load.linear(p + "wkv", width, D);
  c.wgate = load.linear(p + "wgate", width, D);
  c.ape = load.f32(p + "ape", {rate, width});
  c.norm = load.vec(p + "norm.weight", d);
  return c;
}

// The trailing `rope_dim` values of each head of t [T, H*d] (or [T, d] with H = 1), rotated in place.
void rope_tail(Ops& ops, const Tensor& t, int64_t H, int64_t d, const Tensor& pos, const RopeTable& table) {
  ops.rope(split_heads(t, H, d).cols(d - table.rotary_dim, d), pos, table);
}

Tensor upload_i32(Ops& ops, const std::vector<int32_t>& v) {
  Tensor t = ops.scratch(DType::kI32, {int64_t(v.size())});
  ops.copy_from_host(t, v.data());
  return t;
}

// A paged tensor [blocks, rows, width] as [blocks * rows, width].
Tensor flat(const Tensor& paged) {
  return paged.reshape({paged.shape[0] * paged.shape[1], paged.shape[2]});
}

// One sequence of the step, and where its tokens and entries live in the paged cache.
struct SeqView {
  const int32_t* table;  // host block table
  int ctx, q0, qn;       // cached tokens, first row in the step, rows in the step
  int32_t token_slot(int64_t p) const {
    return table[p / kKvBlockSize] * kKvBlockSize + int32_t(p % kKvBlockSize);
  }
  int32_t entry_slot(int64_t e, int rate, int64_t per_block) const {
    return table[((e + 1) * rate - 1) / kKvBlockSize] * int32_t(per_block) + int32_t(e % per_block);
  }
};

// The rows `slots` of `src` (a flat cache tensor, or a range of its columns).
Tensor gather(Ops& ops, const Tensor& src, std::vector<int32_t>& slots) {
  Tensor out = ops.scratch(ops.act_dtype(), {int64_t(slots.size()), src.shape[1]});
  ops.gather_rows(out, src, upload_i32(ops, slots));
  return out;
}

// The compressor's entries [w0, w1) of one sequence from its cached raw projections `proj` (flat
// token cache columns [kv (width) | gate (width)]): pooled, normed and roped at w * rate, as a
// forward over the whole sequence computes them (window w - 1 is gathered too when windows overlap).
Tensor compress(Ops& ops, const ModelConfig& c, const V4Compressor& w, const Tensor& proj, const SeqView& s,
                int rate, bool overlap, int64_t d, const RopeTable& rope, int64_t w0, int64_t w1) {
  const int64_t ws = overlap ? std::max<int64_t>(0, w0 - 1) : w0, width = overlap ? 2 * d : d;
  std::vector<int32_t> slots;
  for (int64_t p = ws * rate; p < w1 * rate; ++p) slots.push_back(s.token_slot(p));
  Tensor rows = gather(ops, proj, slots);
  Tensor pooled = ops.scratch(ops.act_dtype(), {w1 - ws, d});
  ops.compress_pool(pooled, rows.cols(0, width), rows.cols(width, 2 * width), w.ape, rate, overlap);
  Tensor out = pooled.rows(w0 - ws, w1 - ws);
  ops.rmsnorm(out, out, w.norm, float(c.rms_norm_eps));
  std::vector<int32_t> at;
  for (int64_t i = w0; i < w1; ++i) at.push_back(int32_t(i * rate));
  rope_tail(ops, out, 1, d, upload_i32(ops, at), rope);
  return out;
}

}  // namespace

V4AttentionWeights load_v4_attention(const ModelConfig& c, int layer, const std::string& p,
                                     const V4Loaders& load) {
  const V4Config& v = c.v4;
  const int64_t D = c.hidden_size, H = c.num_heads, hd = c.head_dim, G = v.o_groups;
  V4AttentionWeights w;
  w.kind = v.attention[size_t(layer)];
  w.rate = v.compress_rate[size_t(layer)];
  w.wq_a = load.linear(p + "wq_a", c.q_lora_rank, D);
  w.q_norm = load.vec(p + "q_norm.weight", c.q_lora_rank);
  w.wq_b = load.linear(p + "wq_b", H * hd, c.q_lora_rank);
  w.wkv = load.linear(p + "wkv", hd, D);
  w.kv_norm = load.vec(p + "norm.weight", hd);
  w.wo_a = load.linear(p + "wo_a", G * v.o_lora_rank, H * hd / G);
  w.wo_b = load.linear(p + "wo_b", D, G * v.o_lora_rank);
  w.sinks = load.f32(p + "attn_sink", {H});
  if (w.kind != V4Attention::kSliding) {
    const bool csa = w.kind == V4Attention::kCompressedSparse;
    w.comp = load_compressor(p + "compressor.", w.rate, hd, csa, D, load);
    if (csa) {
      const int64_t ih = v.index_n_heads, id = v.index_head_dim;
      w.idx_comp = load_compressor(p + "indexer.compressor.", w.rate, id, true, D, load);
      w.idx_wq_b = load.linear(p + "indexer.wq_b", ih * id, c.q_lora_rank);
      w.idx_weights = load.linear(p + "indexer.weights_proj", ih, D);
    }
  }
  return w;
}

V4CacheWidths v4_cache_widths(const ModelConfig& c, int layer) {
  const V4Config& v = c.v4;
  const V4Attention kind = v.attention[size_t(layer)];
  const int64_t d = c.head_dim, id = v.index_head_dim;
  V4CacheWidths w;
  w.token = d;
  if (kind == V4Attention::kSliding) return w;
  const int rate = v.compress_rate[size_t(layer)];
  BELUGA_CHECK(rate > 0 && (kKvBlockSize % rate == 0 || rate % kKvBlockSize == 0), "deepseek_v4 layer ",
               layer, ": compress rate ", rate, " must divide or be a multiple of the KV block size ",
               kKvBlockSize);
  const bool csa = kind == V4Attention::kCompressedSparse;
  w.token += 2 * (csa ? 2 * d : d) + (csa ? 4 * id : 0);
  w.entry = d + (csa ? id : 0);
  w.entries_per_block = std::max(1, kKvBlockSize / rate);
  return w;
}

void v4_attention(Ops& ops, const ModelConfig& c, const V4AttentionWeights& w, const V4Ropes& ropes,
                  const Tensor& x, const Tensor& pos, const Tensor& ones, const AttnMeta& meta,
                  const V4LayerCache& cache, Tensor out) {
  const V4Config& v = c.v4;
  const DType act = ops.act_dtype();
  const float eps = float(c.rms_norm_eps);
  const int64_t T = x.shape[0], H = c.num_heads, hd = c.head_dim, G = v.o_groups, r = v.o_lora_rank;
  const int64_t ih = v.index_n_heads, id = v.index_head_dim;
  // Sliding layers rotate with the plain rope; compressed layers with their compressor's.
  const bool compressed = w.kind != V4Attention::kSliding, csa = w.kind == V4Attention::kCompressedSparse;
  const RopeTable& rope = compressed ? ropes.compress : ropes.main;
  const RopeTable& rope_inv = compressed ? ropes.compress_inv : ropes.main_inv;
  const int64_t cw = csa ? 2 * hd : hd;  // the compressor's projection width
  const int64_t per_block = compressed ? cache.entries.shape[1] : 0;
  BELUGA_CHECK(int64_t(meta.h_block_table.size()) == int64_t(meta.num_seqs) * meta.max_blocks,
               "deepseek_v4: the step has no host block tables");

  // q: low rank, normed latent (the indexer's query input too), per-head unweighted norm, rope.
  Tensor qa = ops.scratch(act, {T, c.q_lora_rank});
  ops.linear(qa, x, w.wq_a);
  ops.rmsnorm(qa, qa, w.q_norm, eps);
  Tensor q = ops.scratch(act, {T, H * hd});
  ops.linear(q, qa, w.wq_b);
  Tensor q_rows = q.reshape({T * H, hd});
  ops.rmsnorm(q_rows, q_rows, ones.rows(0, hd), eps);
  rope_tail(ops, q, H, hd, pos, rope);

  // Each row's token state, written to the cache before anything reads it: the one KV head (K = V),
  // normed and roped, and the compressors' raw projections.
  Tensor tok = ops.scratch(act, {T, cache.tokens.shape[2]});
  Tensor kv = tok.cols(0, hd);
  ops.linear(kv, x, w.wkv);
  ops.rmsnorm(kv, kv, w.kv_norm, eps);
  rope_tail(ops, kv, 1, hd, pos, rope);
  Tensor iq, hw;
  if (compressed) {
    ops.linear(tok.cols(hd, hd + cw), x, w.comp.wkv);
    ops.linear(tok.cols(hd + cw, hd + 2 * cw), x, w.comp.wgate);
    if (csa) {
      const int64_t o = hd + 2 * cw;
      ops.linear(tok.cols(o, o + 2 * id), x, w.idx_comp.wkv);
      ops.linear(tok.cols(o + 2 * id, o + 4 * id), x, w.idx_comp.wgate);
      iq = ops.scratch(act, {T, ih * id});
      ops.linear(iq, qa, w.idx_wq_b);
      rope_tail(ops, iq, ih, id, pos, ropes.compress);
      hw = ops.scratch(act, {T, ih});
      ops.linear(hw, x, w.idx_weights);
    }
  }
  ops.cache_write(cache.tokens, tok, meta);

  const Tensor tokens = flat(cache.tokens), entries = compressed ? flat(cache.entries) : Tensor{};
  Tensor o = ops.scratch(act, {T, H, hd});
  std::vector<int32_t> slots;
  for (int si = 0; si < meta.num_seqs; ++si) {
    const int q0 = meta.h_query_start[size_t(si)];
    const SeqView s{meta.h_block_table.data() + size_t(si) * size_t(meta.max_blocks),
                    meta.h_context_len[size_t(si)], q0, meta.h_query_start[size_t(si) + 1] - q0};
    const int64_t end = s.ctx + s.qn;
    const Ops::ScratchMark mark = ops.scratch_mark();
    Tensor comp, comp_ids;
    if (compressed) {
      // The entries this step completes, pooled from the cached projections and stored; then all of
      // the sequence's complete entries.
      const int64_t w0 = s.ctx / w.rate, w1 = end / w.rate;
      if (w1 > w0) {
        Tensor fresh = ops.scratch(act, {w1 - w0, cache.entries.shape[2]});
        ops.copy(fresh.cols(0, hd), compress(ops, c, w.comp, tokens.cols(hd, hd + 2 * cw), s, w.rate, csa, hd,
                                             ropes.compress, w0, w1));
        if (csa) {
          const int64_t off = hd + 2 * cw;
          ops.copy(fresh.cols(hd, hd + id), compress(ops, c, w.idx_comp, tokens.cols(off, off + 4 * id), s,
                                                     w.rate, true, id, ropes.compress, w0, w1));
        }
        slots.clear();
        for (int64_t e = w0; e < w1; ++e) slots.push_back(s.entry_slot(e, w.rate, per_block));
        AttnMeta em;
        em.num_tokens = int(slots.size());
        em.slot_mapping = upload_i32(ops, slots).ptr<const int32_t>();
        ops.cache_write(cache.entries, fresh, em);
      }
      if (w1 > 0) {
        slots.clear();
        for (int64_t e = 0; e < w1; ++e) slots.push_back(s.entry_slot(e, w.rate, per_block));
        Tensor all = gather(ops, entries, slots);
        comp = all.cols(0, hd);
        if (csa) {
          comp_ids = ops.scratch(DType::kI32, {s.qn, v.index_topk});
          ops.indexer_topk(comp_ids, split_heads(iq.rows(s.q0, s.q0 + s.qn), ih, id), all.cols(hd, hd + id),
                           hw.rows(s.q0, s.q0 + s.qn), w.rate, float(1.0 / std::sqrt(double(id))),
                           float(1.0 / std::sqrt(double(ih))), s.ctx);
        }
      }
    }
    // The window: the K = V rows of positions [ctx - window + 1, end).
    const int64_t k0 = std::max<int64_t>(0, s.ctx - v.sliding_window + 1);
    slots.clear();
    for (int64_t p = k0; p < end; ++p) slots.push_back(s.token_slot(p));
    Tensor window = gather(ops, tokens.cols(0, hd), slots);
    ops.sink_attention(o.rows(s.q0, s.q0 + s.qn), split_heads(q.rows(s.q0, s.q0 + s.qn), H, hd), window, comp,
                       comp_ids, w.sinks, v.sliding_window, w.rate, float(c.attention_scale()), s.ctx,
                       int(k0));
    ops.scratch_release(mark);
  }
  // K = V carried the keys' rotation into the output: undo it at the query's position.
  rope_tail(ops, merge_heads(o), H, hd, pos, rope_inv);

  // Grouped output projection: each group of heads to its own rank-r slice, then one mix to D.
  const int64_t in_g = H * hd / G;
  Tensor oa = ops.scratch(act, {T, G * r});
  Tensor heads = merge_heads(o);
  for (int64_t g = 0; g < G; ++g) {
    Weight wg = w.wo_a;
    wg.w = w.wo_a.w.rows(g * r, (g + 1) * r);
    ops.linear(oa.cols(g * r, (g + 1) * r), heads.cols(g * in_g, (g + 1) * in_g), wg);
  }
  ops.linear(out, oa, w.wo_b);
}

}  // namespace beluga
