#include "model/deepseek_v4_attention.h"

#include <algorithm>
#include <cmath>

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

// A paged tensor [blocks, rows, width] as [blocks * rows, width].
Tensor flat(const Tensor& paged) {
  return paged.reshape({paged.shape[0] * paged.shape[1], paged.shape[2]});
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

  // The entries this step completes, pooled from the cached projections; then the indexer's picks
  // among each sequence's complete entries (CSA) and the attention over window and entries.
  const Tensor tokens = flat(cache.tokens), entries = compressed ? flat(cache.entries) : Tensor{};
  const int per_block = compressed ? int(cache.entries.shape[1]) : 0;
  Tensor comp, comp_ids;
  if (compressed) {
    ops.v4_compress(entries.cols(0, hd), per_block, tokens.cols(hd, hd + 2 * cw), w.comp.ape, w.comp.norm,
                    eps, ropes.compress, w.rate, csa, meta);
    comp = entries.cols(0, hd);
    if (csa) {
      const int64_t off = hd + 2 * cw;
      const Tensor keys = entries.cols(hd, hd + id);
      ops.v4_compress(keys, per_block, tokens.cols(off, off + 4 * id), w.idx_comp.ape, w.idx_comp.norm, eps,
                      ropes.compress, w.rate, true, meta);
      comp_ids = ops.scratch(DType::kI32, {T, v.index_topk});
      ops.v4_indexer_topk(comp_ids, split_heads(iq, ih, id), keys, per_block, hw, w.rate,
                          float(1.0 / std::sqrt(double(id))), float(1.0 / std::sqrt(double(ih))), meta);
    }
  }
  Tensor o = ops.scratch(act, {T, H, hd});
  ops.v4_sink_attention(o, split_heads(q, H, hd), tokens.cols(0, hd), comp, per_block, comp_ids, w.sinks,
                        v.sliding_window, w.rate, float(c.attention_scale()), meta);
  // K = V carried the keys' rotation into the output: undo it at the query's position.
  rope_tail(ops, merge_heads(o), H, hd, pos, rope_inv);

  // Grouped output projection: each group of heads to its own rank-r slice (one per-group product,
  // or a linear per group for FP8 weights, whose block scales split with the rows), then one mix to D.
  const int64_t in_g = H * hd / G;
  Tensor oa = ops.scratch(act, {T, G * r});
  Tensor heads = merge_heads(o);
  if (w.wo_a.scale.empty()) {
    ops.linear_heads(split_heads(oa, G, r), split_heads(heads, G, in_g), w.wo_a.w.reshape({G, r, in_g}));
  } else {
    for (int64_t g = 0; g < G; ++g) {
      Weight wg = w.wo_a;
      wg.w = w.wo_a.w.rows(g * r, (g + 1) * r);
      wg.scale = w.wo_a.scale.rows(g * r / wg.block_n, (g + 1) * r / wg.block_n);
      ops.linear(oa.cols(g * r, (g + 1) * r), heads.cols(g * in_g, (g + 1) * in_g), wg);
    }
  }
  ops.linear(out, oa, w.wo_b);
}

}  // namespace beluga
