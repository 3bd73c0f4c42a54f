// Dense decoder-only transformers: Llama (llama3 rope scaling), Qwen2 (q/k/v bias), Qwen3 (per-head
// q/k RMSNorm, tied embeddings). GQA over a paged cache of K and V per KV head.
#include "model/layers.h"
#include "model/model.h"
#include "model/rope.h"
#include "util/error.h"

namespace beluga {

namespace {

struct Layer {
  Tensor input_norm, post_norm;
  Weight q, k, v, o;
  Tensor q_norm, k_norm;
  MlpWeights mlp;
};

class DenseModel final : public Model {
 public:
  DenseModel(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions) : Model(cfg, ops) {
    const auto& c = cfg_;
    const int64_t D = c.hidden_size, H = c.num_heads, KVH = c.num_kv_heads, hd = c.head_dim,
                  I = c.intermediate_size;
    embed_ = ops.upload(src.get("model.embed_tokens.weight", {c.vocab_size, D}));
    n_params_ += int64_t(c.vocab_size) * D;
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Layer L;
      L.input_norm = load_vector(src, p + "input_layernorm.weight", D);
      L.post_norm = load_vector(src, p + "post_attention_layernorm.weight", D);
      L.q = load_linear(src, p + "self_attn.q_proj", H * hd, D);
      L.k = load_linear(src, p + "self_attn.k_proj", KVH * hd, D);
      L.v = load_linear(src, p + "self_attn.v_proj", KVH * hd, D);
      L.o = load_linear(src, p + "self_attn.o_proj", D, H * hd);
      if (c.qkv_bias)
        BELUGA_CHECK(!L.q.bias.empty() && !L.k.bias.empty() && !L.v.bias.empty(), p,
                     "self_attn: q/k/v biases missing");
      if (c.qk_norm) {
        L.q_norm = load_vector(src, p + "self_attn.q_norm.weight", hd);
        L.k_norm = load_vector(src, p + "self_attn.k_norm.weight", hd);
      }
      L.mlp = {load_linear(src, p + "mlp.gate_proj", I, D), load_linear(src, p + "mlp.up_proj", I, D),
               load_linear(src, p + "mlp.down_proj", D, I)};
      layers_.push_back(std::move(L));
    }
    final_norm_ = load_vector(src, "model.norm.weight", D);
    if (c.tie_word_embeddings) {
      Tensor head = src.find("lm_head.weight", {c.vocab_size, D});
      lm_head_.w = head.empty() ? embed_ : ops.upload(head);
    } else {
      lm_head_ = load_linear(src, "lm_head", c.vocab_size, D);
    }
    max_positions_ = max_positions;
    std::vector<float> cs, sn;
    rope_tables(c, int(hd), max_positions, &cs, &sn);
    rope_.cos = ops.alloc_persistent(DType::kF32, {max_positions, hd / 2});
    rope_.sin = ops.alloc_persistent(DType::kF32, {max_positions, hd / 2});
    ops.copy_from_host(rope_.cos, cs.data());
    ops.copy_from_host(rope_.sin, sn.data());
    rope_.rotary_dim = int(hd);
    rope_.interleaved = false;
  }

 private:
  LayerNorms layer_norms(int l) const override {
    return {layers_[size_t(l)].input_norm, layers_[size_t(l)].post_norm};
  }

  void feed_forward(int l, const NormedInput& in, Tensor out) override {
    run_mlp(ops_, layers_[size_t(l)].mlp, in, out);
  }

  Tensor attention(int l, const NormedInput& in, const AttnMeta& meta, const Tensor& pos, Tensor cache,
                   const ForwardOptions&, int) override {
    const auto& c = cfg_;
    const Layer& L = layers_[size_t(l)];
    const Tensor& x = in.out;
    const int64_t T = x.shape[0], H = c.num_heads, KVH = c.num_kv_heads, hd = c.head_dim;
    const float eps = float(c.rms_norm_eps);
    Tensor q = ops_.scratch(ops_.act_dtype(), {T, H * hd});
    ops_.norm_linear(q, in, L.q);
    // K and V are computed straight into the layout of a cache entry.
    Tensor kv = ops_.scratch(ops_.act_dtype(), {T, 2 * KVH * hd});
    ops_.linear(kv.cols(0, KVH * hd), x, L.k);
    ops_.linear(kv.cols(KVH * hd, 2 * KVH * hd), x, L.v);
    Tensor q3 = split_heads(q, H, hd);
    Tensor k3 = split_heads(kv.cols(0, KVH * hd), KVH, hd);
    if (c.qk_norm) {
      for (int64_t h = 0; h < H; ++h) ops_.rmsnorm(head(q3, h), head(q3, h), L.q_norm, eps);
      for (int64_t h = 0; h < KVH; ++h) ops_.rmsnorm(head(k3, h), head(k3, h), L.k_norm, eps);
    }
    ops_.rope(q3, pos, rope_);
    ops_.rope(k3, pos, rope_);
    ops_.cache_write(cache, kv, meta);
    Tensor o = ops_.scratch(ops_.act_dtype(), {T, H, hd});
    ops_.gqa_attention(o, q3, cache, meta, int(KVH), float(c.attention_scale()));
    Tensor out = ops_.scratch(ops_.act_dtype(), {T, c.hidden_size});
    ops_.linear(out, merge_heads(o), L.o);
    return out;
  }

  std::vector<Layer> layers_;
};

}  // namespace

std::unique_ptr<Model> make_dense(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions) {
  return std::make_unique<DenseModel>(cfg, src, ops, max_positions);
}

}  // namespace beluga
