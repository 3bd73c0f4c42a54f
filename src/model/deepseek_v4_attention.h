// DeepSeek-V4 attention for one sequence's rows (row i at position i): shared-KV MQA with per-head
// sinks over a sliding window, plus the compressed entries of CSA (gated pooling of every `rate`
// tokens, of which the lightning indexer picks top-k per query) or HCA (every complete entry);
// partial rope on the trailing slice of each head, its inverse on the output, grouped low-rank
// output projection. Written against Ops; the weights as the publisher names them.
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

// out [T, D] = the attention of x [T, D] (the normed layer input); pos I32 [T] = 0..T-1; `ones` an
// F32 vector of at least head_dim ones (the unweighted per-head norm).
void v4_attention(Ops& ops, const ModelConfig& c, const V4AttentionWeights& w, const V4Ropes& ropes,
                  const Tensor& x, const Tensor& pos, const Tensor& ones, Tensor out);

}  // namespace beluga
