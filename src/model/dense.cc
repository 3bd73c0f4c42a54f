// Dense decoder-only transformers: Llama (llama3 rope scaling), Qwen2 (q/k/v bias), Qwen3 (per-head
// q/k RMSNorm, tied embeddings). GQA over a paged cache of K and V per KV head. Tensor parallel
// (model.h: TensorParallelism): a rank holds heads [H r / N, H (r + 1) / N) with their KV heads and
// its part of the MLP, and sums the o and down products over the group.
#include "model/layers.h"
#include "model/model.h"
#include "model/rope.h"
#include "parallel/tensor_parallel.h"
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
  DenseModel(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions,
             const TensorParallelism* tp)
      : Model(cfg, ops), tp_(tp ? tp->comm : nullptr) {
    const auto& c = cfg_;
    const int64_t D = c.hidden_size, H = c.num_heads, KVH = c.num_kv_heads, hd = c.head_dim,
                  I = c.intermediate_size;
    const int part = tp_ ? tp_->rank() : 0, parts = tp_ ? tp_->size() : 1;
    heads_ = H / parts;
    kv_heads_ = KVH / parts;
    // Its collectives are planned on the host between the ranks' products: no graph holds a step.
    if (tp_) always_eager_ = enforce_eager_ = true;
    // Column parallel (this rank's output rows) and row parallel (its input columns).
    auto column = [&](const std::string& name, int64_t out, int64_t in) {
      return load_linear_part(src, name, out, in, 0, part, parts);
    };
    auto row = [&](const std::string& name, int64_t out, int64_t in) {
      return load_linear_part(src, name, out, in, 1, part, parts);
    };
    embed_ = ops.upload(src.get("model.embed_tokens.weight", {c.vocab_size, D}));
    n_params_ += int64_t(c.vocab_size) * D;
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Layer L;
      L.input_norm = load_vector(src, p + "input_layernorm.weight", D);
      L.post_norm = load_vector(src, p + "post_attention_layernorm.weight", D);
      L.q = column(p + "self_attn.q_proj", H * hd, D);
      L.k = column(p + "self_attn.k_proj", KVH * hd, D);
      L.v = column(p + "self_attn.v_proj", KVH * hd, D);
      L.o = row(p + "self_attn.o_proj", D, H * hd);
      if (c.qkv_bias)
        BELUGA_CHECK(!L.q.bias.empty() && !L.k.bias.empty() && !L.v.bias.empty(), p,
                     "self_attn: q/k/v biases missing");
      if (c.qk_norm) {
        L.q_norm = load_vector(src, p + "self_attn.q_norm.weight", hd);
        L.k_norm = load_vector(src, p + "self_attn.k_norm.weight", hd);
      }
      L.mlp = {column(p + "mlp.gate_proj", I, D), column(p + "mlp.up_proj", I, D),
               row(p + "mlp.down_proj", D, I)};
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

  std::vector<KvTensorShape> kv_layout() const override {
    return std::vector<KvTensorShape>(size_t(cfg_.num_layers), {kKvBlockSize, 2 * kv_heads_ * cfg_.head_dim});
  }

  void feed_forward(int l, const NormedInput& in, Tensor out) override {
    run_mlp(ops_, layers_[size_t(l)].mlp, in, out);
    if (tp_) all_reduce_sum(ops_, *tp_, out);
  }

  Tensor attention(int l, const NormedInput& in, const AttnMeta& meta, const Tensor& pos, Tensor cache,
                   const ForwardOptions&, int) override {
    const auto& c = cfg_;
    const Layer& L = layers_[size_t(l)];
    const Tensor& x = in.out;
    const int64_t T = x.shape[0], H = heads_, KVH = kv_heads_, hd = c.head_dim;
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
    if (tp_) all_reduce_sum(ops_, *tp_, out);
    return out;
  }

  std::vector<Layer> layers_;
  Communicator* tp_;          // the tensor-parallel group (null: every head here)
  int64_t heads_, kv_heads_;  // this rank's
};

}  // namespace

std::unique_ptr<Model> make_dense(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions,
                                  const TensorParallelism* tp) {
  return std::make_unique<DenseModel>(cfg, src, ops, max_positions, tp);
}

}  // namespace beluga
