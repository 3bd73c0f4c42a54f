// DeepSeek-V4 attention over a step's rows (any mix of prefill chunks and decode tokens) and the
// layer's part of the hybrid paged cache: shared-KV MQA with per-head sinks over a sliding window,
// plus the compressed entries of CSA (gated pooling of every `rate` tokens, of which the lightning
// indexer picks top-k per query) or HCA (every complete entry); partial rope on the trailing slice
// of each head, its inverse on the output, grouped low-rank output projection. Written against Ops;
// the weights as the publisher names them.
//
// Cache (V4LayerCache): per token, the roped K = V row and the compressors' raw kv / gate
// projections (the open window's tail and, for CSA, the window before it are pooled from them);
// per compressed entry, the pooled, normed, roped K = V (and the indexer's key). Every value is a
// function of the sequence's tokens up to the block that holds it, so a block never changes once
// full and a cached prefix restores everything by block reuse.
#pragma once

#include <functional>
#include <string>

#include "backend/ops.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"

namespace beluga {

// The rotary tables a V4 layer uses: the sliding layers' plain rope, the compressed branches' yarn
// rope, and each one's inverse (sin negated) for the output's de-rotation.
struct V4Ropes {
  RopeTable main, main_inv, compress, compress_inv;
};

struct V4Compressor {
  Weight wkv, wgate;  // [c*d, D] with c = 2 when windows overlap (CSA)
  Tensor ape;         // F32 [rate, c*d]: learned position biases of the gate
  Tensor norm;        // [d]
};

struct V4AttentionWeights {
  V4Attention kind = V4Attention::kSliding;
  int rate = 0;
  Weight wq_a, wq_b, wkv, wo_a, wo_b;
  Tensor q_norm, kv_norm;
  Tensor sinks;  // F32 [H]
  V4Compressor comp;
  // CSA's lightning indexer: its own compressor (index_head_dim), query heads from the q latent,
  // per-head weights from the layer input.
  V4Compressor idx_comp;
  Weight idx_wq_b, idx_weights;
};

// Loads layer attention weights under `prefix` ("model.layers.N.attn."). `load` reads a linear
// (counting parameters), `vec` a vector kept as stored, `f32` a small tensor converted to F32.
struct V4Loaders {
  std::function<Weight(const std::string&, int64_t, int64_t)> linear;
  std::function<Tensor(const std::string&, int64_t)> vec;
  std::function<Tensor(const std::string&, std::initializer_list<int64_t>)> f32;
};
V4AttentionWeights load_v4_attention(const ModelConfig& c, int layer, const std::string& prefix,
                                     const V4Loaders& load);

// The token row's columns: [kv (d) | compressor kv (cw) | compressor gate (cw) | indexer kv (2 id) |
// indexer gate (2 id)] with cw = d, or 2 d when windows overlap (CSA); the entry row's: [pooled kv
// (d) | indexer key (id)]. Entry e (tokens [e r, e r + r)) sits in the block of its last token, at
// row e % entries_per_block (entries_per_block = max(1, 64 / r); r divides 64 or 64 divides r).
struct V4CacheWidths {
  int64_t token = 0, entry = 0, entries_per_block = 0;  // entry 0: a sliding layer
};
V4CacheWidths v4_cache_widths(const ModelConfig& c, int layer);

// One layer's cache tensors ([num_blocks, 64, token] and [num_blocks, entries_per_block, entry]).
struct V4LayerCache {
  Tensor tokens, entries;  // entries empty on sliding layers
};

// out [T, D] = the attention of x [T, D] (the normed layer input) for the step `meta` describes
// (its positions `pos`, slots and host block tables); writes the rows' token state and the entries
// they complete into `cache` first. `ones` an F32 vector of at least head_dim ones.
void v4_attention(Ops& ops, const ModelConfig& c, const V4AttentionWeights& w, const V4Ropes& ropes,
                  const Tensor& x, const Tensor& pos, const Tensor& ones, const AttnMeta& meta,
                  const V4LayerCache& cache, Tensor out);

}  // namespace beluga
