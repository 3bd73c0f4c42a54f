#include "model/deepseek_v4_attention.h"

#include <cmath>
#include <vector>

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

// One compressor over x [T, D]: the T / rate pooled entries [W, d], normed and roped at w * rate.
// Empty when no window is complete yet.
Tensor compress(Ops& ops, const ModelConfig& c, const V4Compressor& w, const Tensor& x, int rate,
                bool overlap, int64_t d, const RopeTable& rope) {
  const int64_t T = x.shape[0], W = T / rate, width = overlap ? 2 * d : d;
  if (W == 0) return {};
  const DType act = ops.act_dtype();
  Tensor kv = ops.scratch(act, {T, width}), gate = ops.scratch(act, {T, width});
  ops.linear(kv, x, w.wkv);
  ops.linear(gate, x, w.wgate);
  Tensor pooled = ops.scratch(act, {W, d});
  ops.compress_pool(pooled, kv, gate, w.ape, rate, overlap);
  ops.rmsnorm(pooled, pooled, w.norm, float(c.rms_norm_eps));
  std::vector<int32_t> at(static_cast<size_t>(W));
  for (int64_t i = 0; i < W; ++i) at[size_t(i)] = int32_t(i * rate);
  Tensor positions = ops.scratch(DType::kI32, {W});
  ops.copy_from_host(positions, at.data());
  rope_tail(ops, pooled, 1, d, positions, rope);
  return pooled;
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

void v4_attention(Ops& ops, const ModelConfig& c, const V4AttentionWeights& w, const V4Ropes& ropes,
                  const Tensor& x, const Tensor& pos, const Tensor& ones, Tensor out) {
  const V4Config& v = c.v4;
  const DType act = ops.act_dtype();
  const float eps = float(c.rms_norm_eps);
  const int64_t T = x.shape[0], H = c.num_heads, hd = c.head_dim, G = v.o_groups, r = v.o_lora_rank;
  // Sliding layers rotate with the plain rope; compressed layers with their compressor's.
  const bool compressed = w.kind != V4Attention::kSliding;
  const RopeTable& rope = compressed ? ropes.compress : ropes.main;
  const RopeTable& rope_inv = compressed ? ropes.compress_inv : ropes.main_inv;

  // q: low rank, normed latent (the indexer's query input too), per-head unweighted norm, rope.
  Tensor qa = ops.scratch(act, {T, c.q_lora_rank});
  ops.linear(qa, x, w.wq_a);
  ops.rmsnorm(qa, qa, w.q_norm, eps);
  Tensor q = ops.scratch(act, {T, H * hd});
  ops.linear(q, qa, w.wq_b);
  Tensor q_rows = q.reshape({T * H, hd});
  ops.rmsnorm(q_rows, q_rows, ones.rows(0, hd), eps);
  rope_tail(ops, q, H, hd, pos, rope);
  // The one KV head (K = V), normed and roped.
  Tensor kv = ops.scratch(act, {T, hd});
  ops.linear(kv, x, w.wkv);
  ops.rmsnorm(kv, kv, w.kv_norm, eps);
  rope_tail(ops, kv, 1, hd, pos, rope);

  Tensor comp, comp_ids;
  if (compressed) {
    const bool csa = w.kind == V4Attention::kCompressedSparse;
    comp = compress(ops, c, w.comp, x, w.rate, csa, hd, ropes.compress);
    if (csa && !comp.empty()) {
      const int64_t ih = v.index_n_heads, id = v.index_head_dim;
      Tensor keys = compress(ops, c, w.idx_comp, x, w.rate, true, id, ropes.compress);
      Tensor iq = ops.scratch(act, {T, ih * id});
      ops.linear(iq, qa, w.idx_wq_b);
      rope_tail(ops, iq, ih, id, pos, ropes.compress);
      Tensor hw = ops.scratch(act, {T, ih});
      ops.linear(hw, x, w.idx_weights);
      comp_ids = ops.scratch(DType::kI32, {T, v.index_topk});
      ops.indexer_topk(comp_ids, split_heads(iq, ih, id), keys, hw, w.rate,
                       float(1.0 / std::sqrt(double(id))), float(1.0 / std::sqrt(double(ih))));
    }
  }
  Tensor o = ops.scratch(act, {T, H, hd});
  ops.sink_attention(o, split_heads(q, H, hd), kv, comp, comp_ids, w.sinks, v.sliding_window, w.rate,
                     float(c.attention_scale()));
  // K = V carried the keys' rotation into the output: undo it at the query's position.
  rope_tail(ops, merge_heads(o), H, hd, pos, rope_inv);

  // Grouped output projection: each group of heads to its own rank-r slice, then one mix to D.
  const int64_t in_g = H * hd / G;
  Tensor oa = ops.scratch(act, {T, G * r});
  Tensor flat = merge_heads(o);
  for (int64_t g = 0; g < G; ++g) {
    Weight wg = w.wo_a;
    wg.w = w.wo_a.w.rows(g * r, (g + 1) * r);
    ops.linear(oa.cols(g * r, (g + 1) * r), flat.cols(g * in_g, (g + 1) * in_g), wg);
  }
  ops.linear(out, oa, w.wo_b);
}

}  // namespace beluga
