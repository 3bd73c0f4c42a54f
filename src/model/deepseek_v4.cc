// DeepSeek-V4: hybrid attention (deepseek_v4_attention.h) inside manifold-constrained
// hyper-connections (hc_mult residual streams mixed by Sinkhorn-normalized weights around every
// attention and feed-forward block, collapsed by the hyper head before the final norm), and MoE
// feed-forward layers routed by a frozen token -> experts table (hash layers) or sqrtsoftplus top-k.
//
// The hybrid KV cache (deepseek_v4_attention.h says what each layer keeps) is paged like every other
// model's: Model::kv_layout gives each layer a token tensor (64 rows per block: the K = V row and the
// compressors' raw projections) and, on compressed layers, an entry tensor (one row per `rate`
// tokens, in the block of the window's last token). A step writes its rows' state, pools the
// windows it completes, and reads only the last sliding_window rows and the complete entries, so a
// decode step costs O(window + context / rate) per layer, not a forward over the prefix. Every block
// is a function of the tokens up to its end and is never written once full: the block manager's
// prefix cache and the KV connector's tiers share and restore blocks as for MLA (a hit restores the
// window, the entries and the open window's projections alike), at any block boundary. The step's
// attention ops address the cache from the step's device arrays alone (Ops::v4_*), so decode steps
// replay recorded graphs as the other models' do.
#include <algorithm>
#include <cmath>
#include <vector>

#include "model/deepseek_v4_attention.h"
#include "model/layers.h"
#include "model/model.h"
#include "model/rope.h"
#include "util/error.h"

namespace beluga {

namespace {

// The learned mixing of one hyper-connection: fn [(2+n)*n, n*D], base [(2+n)*n], scale [3].
struct HyperConnection {
  Weight fn;
  Tensor base, scale;  // F32
};

struct Layer {
  HyperConnection hc_attn, hc_ffn;
  Tensor attn_norm, ffn_norm;
  V4AttentionWeights attn;
  bool hash = false;
  Weight router;
  Tensor bias;     // F32 [E] selection bias (learned-routing layers)
  Tensor tid2eid;  // I32 [vocab, k] (hash layers)
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;
};

class DeepseekV4Model final : public Model {
 public:
  DeepseekV4Model(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions) : Model(cfg, ops) {
    // FP8 checkpoints (DeepSeek's block format, as V3's) load through load_linear; the grouped output
    // projection is split into its groups by rows, so each group must start on a scale block.
    BELUGA_CHECK(!cfg.fp8 || cfg.v4.o_lora_rank % cfg.fp8_block_n == 0,
                 "deepseek_v4: FP8 weights need o_lora_rank (", cfg.v4.o_lora_rank,
                 ") to be a multiple of the weight block's rows (", cfg.fp8_block_n, ")");
    const auto& c = cfg_;
    const V4Config& v = c.v4;
    const int64_t D = c.hidden_size, n = v.hc_mult, E = c.n_routed_experts, I = c.moe_intermediate_size,
                  K = c.num_experts_per_tok;
    embed_ = ops.upload(src.get("model.embed_tokens.weight", {c.vocab_size, D}));
    n_params_ += int64_t(c.vocab_size) * D;
    V4Loaders load{
        [&](const std::string& p, int64_t out, int64_t in) { return load_linear(src, p, out, in); },
        [&](const std::string& name, int64_t len) { return load_vector(src, name, len); },
        [&](const std::string& name, std::initializer_list<int64_t> shape) {
          return load_f32(src, name, shape);
        }};
    const float limit = float(v.swiglu_limit);
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Layer L;
      L.hc_attn = load_hc(src, p + "hc_attn_", (2 + n) * n, 3);
      L.hc_ffn = load_hc(src, p + "hc_ffn_", (2 + n) * n, 3);
      L.attn_norm = load_vector(src, p + "attn_norm.weight", D);
      L.ffn_norm = load_vector(src, p + "ffn_norm.weight", D);
      L.attn = load_v4_attention(c, l, p + "attn.", load);
      L.hash = v.hash_moe[size_t(l)];
      L.router = load_linear(src, p + "ffn.gate", E, D);
      if (!L.router.bias.empty()) {  // ffn.gate.bias selects experts; it is not added to the logits
        L.router.bias = {};
        n_params_ -= E;
      }
      if (L.hash) {
        L.tid2eid = load_hash_table(src, p + "ffn.gate.tid2eid", c.vocab_size, K);
      } else {
        // transformers' e_score_correction_bias: a buffer, not counted as a parameter.
        const int64_t before = n_params_;
        L.bias = load_f32(src, p + "ffn.gate.bias", {E});
        n_params_ = before;
      }
      for (int64_t e = 0; e < E; ++e) {
        const std::string ep = p + "ffn.experts." + std::to_string(e) + ".";
        L.experts.push_back({load_linear(src, ep + "w1", I, D), load_linear(src, ep + "w3", I, D),
                             load_linear(src, ep + "w2", D, I), limit});
      }
      if (c.n_shared_experts > 0) {
        const int64_t Is = I * c.n_shared_experts;
        L.shared = {load_linear(src, p + "ffn.shared_experts.w1", Is, D),
                    load_linear(src, p + "ffn.shared_experts.w3", Is, D),
                    load_linear(src, p + "ffn.shared_experts.w2", D, Is), limit};
      }
      layers_.push_back(std::move(L));
    }
    for (int l = 0; l < c.num_layers; ++l) {
      const V4CacheWidths w = v4_cache_widths(c, l);
      token_tensor_.push_back(int(layout_.size()));
      layout_.push_back({kKvBlockSize, w.token});
      entry_tensor_.push_back(w.entry == 0 ? -1 : int(layout_.size()));
      if (w.entry > 0) layout_.push_back({w.entries_per_block, w.entry});
    }
    head_hc_ = load_hc(src, "model.hc_head.hc_", n, 1);
    final_norm_ = load_vector(src, "model.norm.weight", D);
    lm_head_ = load_linear(src, "head", c.vocab_size, D);  // MTP layers (mtp.*) are not loaded

    max_positions_ = max_positions;
    ModelConfig main = c, comp = c;
    comp.rope_theta = v.compress_rope_theta;
    comp.rope = v.compress_rope;
    ropes_.main = make_rope(main, false);
    ropes_.main_inv = make_rope(main, true);
    ropes_.compress = make_rope(comp, false);
    ropes_.compress_inv = make_rope(comp, true);
    std::vector<float> one(size_t(std::max<int64_t>(n * D, c.head_dim)), 1.0f);
    ones_ = ops.alloc_persistent(DType::kF32, {int64_t(one.size())});
    ops.copy_from_host(ones_, one.data());
    scoring_ = c.scoring_func == ModelConfig::ScoringFunc::kSqrtSoftplus ? RouterScoring::kSqrtSoftplus
               : c.scoring_func == ModelConfig::ScoringFunc::kSigmoid    ? RouterScoring::kSigmoid
                                                                         : RouterScoring::kSoftmax;
  }

 private:
  // A small tensor (biases, scales, sinks, position biases) as F32 on the device, counted.
  Tensor load_f32(WeightSource& src, const std::string& name, std::initializer_list<int64_t> shape) {
    Tensor host = src.get(name, std::vector<int64_t>(shape), DType::kF32);
    const int64_t count = host.numel();
    BELUGA_CHECK(host.dtype == DType::kF32 || host.dtype == DType::kBF16, name, ": unsupported dtype ",
                 host.describe());
    // A source may make its tensors on the device (dummy weights on CUDA): read them back first.
    std::vector<unsigned char> staged;
    if (host.device != Device::kCpu) {
      staged.resize(size_t(host.nbytes()));
      ops_.copy_to_host(host, staged.data());
      host.data = staged.data();
      host.device = Device::kCpu;
    }
    std::vector<float> vals(static_cast<size_t>(count));
    if (host.dtype == DType::kF32) {
      for (int64_t i = 0; i < count; ++i) vals[size_t(i)] = host.ptr<const float>()[i];
    } else {
      for (int64_t i = 0; i < count; ++i) vals[size_t(i)] = bf16_to_f32(host.ptr<const uint16_t>()[i]);
    }
    Tensor t = shape.size() == 1 ? ops_.alloc_persistent(DType::kF32, {count})
                                 : ops_.alloc_persistent(DType::kF32, {host.shape[0], count / host.shape[0]});
    ops_.copy_from_host(t, vals.data());
    n_params_ += count;
    return t;
  }

  Tensor load_hash_table(WeightSource& src, const std::string& name, int64_t vocab, int64_t k) {
    Tensor host = src.get_ids(name, {vocab, k}, cfg_.n_routed_experts);
    std::vector<int32_t> ids(size_t(vocab * k));
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t e = host.dtype == DType::kI64   ? host.ptr<const int64_t>()[i]
                        : host.dtype == DType::kI32 ? host.ptr<const int32_t>()[i]
                                                    : -1;
      BELUGA_CHECK(host.dtype == DType::kI64 || host.dtype == DType::kI32, name,
                   ": expected integer ids, got ", host.describe());
      BELUGA_CHECK(e >= 0 && e < cfg_.n_routed_experts, name, ": expert id ", e, " out of range");
      ids[i] = int32_t(e);
    }
    Tensor t = ops_.alloc_persistent(DType::kI32, {vocab, k});
    ops_.copy_from_host(t, ids.data());
    return t;
  }

  HyperConnection load_hc(WeightSource& src, const std::string& p, int64_t mix, int64_t scales) {
    const int64_t width = cfg_.v4.hc_mult * cfg_.hidden_size;
    // The mixing matrix has no ".weight" suffix (a parameter, not a Linear, in the checkpoint).
    HyperConnection hc;
    Tensor fn = src.get(p + "fn", {mix, width});
    BELUGA_CHECK(fn.dtype == DType::kBF16 || fn.dtype == DType::kF32, p, "fn: unsupported dtype ",
                 fn.describe());
    hc.fn.w = ops_.upload(fn);
    n_params_ += mix * width;
    hc.base = load_f32(src, p + "base", {mix});
    hc.scale = load_f32(src, p + "scale", {scales});
    return hc;
  }

  RopeTable make_rope(const ModelConfig& c, bool inverse) {
    const int dim = c.v4.rope_dim;
    std::vector<float> cs, sn;
    rope_tables(c, dim, max_positions_, &cs, &sn);
    if (inverse)
      for (float& s : sn) s = -s;
    RopeTable t;
    t.cos = ops_.alloc_persistent(DType::kF32, {max_positions_, dim / 2});
    t.sin = ops_.alloc_persistent(DType::kF32, {max_positions_, dim / 2});
    ops_.copy_from_host(t.cos, cs.data());
    ops_.copy_from_host(t.sin, sn.data());
    t.rotary_dim = dim;
    t.interleaved = true;
    return t;
  }

  // The base class's layer hooks: V4's step (below) drives its own loop around these.
  LayerNorms layer_norms(int l) const override {
    return {layers_[size_t(l)].attn_norm, layers_[size_t(l)].ffn_norm};
  }

  // V4's step runs its layers itself (hyper-connections, two cache tensors per compressed layer).
  Tensor attention(int, const NormedInput&, const AttnMeta&, const Tensor&, Tensor, const ForwardOptions&,
                   int) override {
    fail("deepseek_v4: attention runs from the model's own step (step_body), not the shared layer loop");
  }

  // Needs seq_tokens_, the token ids of the rows being run (hash routing).
  void feed_forward(int l, const NormedInput& in, Tensor out) override {
    const Layer& L = layers_[size_t(l)];
    ops_.normalize(in);
    const Tensor& x = in.out;
    const int64_t T = x.shape[0], K = cfg_.num_experts_per_tok;
    Tensor logits = ops_.scratch(DType::kF32, {T, cfg_.n_routed_experts});
    ops_.linear(logits, x, L.router);
    Tensor ids = ops_.scratch(DType::kI32, {T, K}), weights = ops_.scratch(DType::kF32, {T, K});
    ops_.moe_route_v4(ids, weights, logits, L.bias, L.tid2eid, seq_tokens_, scoring_,
                      float(cfg_.routed_scaling_factor));
    ops_.moe_experts(out, x, ids, weights, L.experts, L.shared.gate.w.empty() ? nullptr : &L.shared);
  }

  // One hyper-connected block: collapse the streams with `hc`'s pre weights, run the block on the
  // normed result, and write the expanded output mixed with the streams into `next`.
  template <typename Block>
  void hc_block(const HyperConnection& hc, const Tensor& norm, const Tensor& streams, Tensor next,
                Block&& block) {
    const int64_t T = streams.shape[0], n = cfg_.v4.hc_mult, D = cfg_.hidden_size;
    const float eps = float(cfg_.rms_norm_eps);
    Tensor flat = ops_.scratch(ops_.act_dtype(), {T, n * D});
    ops_.rmsnorm(flat, streams, ones_.rows(0, n * D), eps);
    Tensor mix = ops_.scratch(DType::kF32, {T, (2 + n) * n});
    ops_.linear(mix, flat, hc.fn);
    Tensor pre = ops_.scratch(DType::kF32, {T, n}), post = ops_.scratch(DType::kF32, {T, n});
    Tensor comb = ops_.scratch(DType::kF32, {T, n * n});
    ops_.hc_weights(pre, post, comb, mix, hc.base, hc.scale, cfg_.v4.hc_sinkhorn_iters,
                    float(cfg_.v4.hc_eps));
    Tensor collapsed = ops_.scratch(ops_.act_dtype(), {T, D});
    ops_.hc_collapse(collapsed, streams, pre);
    Tensor x = ops_.scratch(ops_.act_dtype(), {T, D});
    Tensor y = block(NormedInput{collapsed, {}, norm, x, eps, {}});
    ops_.hc_expand(next, streams, post, comb, y);
  }

  // Embedding, the hyper-connected layers over the hybrid cache, the hyper head and the final norm,
  // then the logits of `rows`.
  Tensor step_body(const AttnMeta& meta, const Tensor& ids, const Tensor& pos, const Tensor& rows,
                   KvCache& kv, const ForwardOptions& opt, int) override {
    BELUGA_CHECK(!opt.hidden_capture, "deepseek_v4: hidden-state capture is not supported yet");
    const int64_t T = meta.num_tokens, n = cfg_.v4.hc_mult, D = cfg_.hidden_size;
    const DType act = ops_.act_dtype();
    Tensor emb = ops_.scratch(act, {T, D});
    ops_.embedding(emb, embed_, ids);
    Tensor streams[2] = {ops_.scratch(act, {T, n * D}), ops_.scratch(act, {T, n * D})};
    for (int64_t k = 0; k < n; ++k) ops_.copy(streams[0].cols(k * D, (k + 1) * D), emb);
    seq_tokens_ = ids;
    int cur = 0;
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const Layer& L = layers_[size_t(l)];
      const V4LayerCache cache{
          kv.layers[size_t(token_tensor_[size_t(l)])],
          entry_tensor_[size_t(l)] < 0 ? Tensor{} : kv.layers[size_t(entry_tensor_[size_t(l)])]};
      const Ops::ScratchMark mark = ops_.scratch_mark();
      hc_block(L.hc_attn, L.attn_norm, streams[cur], streams[cur ^ 1], [&](const NormedInput& in) {
        ops_.normalize(in);
        Tensor out = ops_.scratch(act, {T, D});
        v4_attention(ops_, cfg_, L.attn, ropes_, in.out, pos, ones_, meta, cache, out);
        return out;
      });
      cur ^= 1;
      hc_block(L.hc_ffn, L.ffn_norm, streams[cur], streams[cur ^ 1], [&](const NormedInput& in) {
        Tensor out = ops_.scratch(act, {T, D});
        feed_forward(l, in, out);
        return out;
      });
      cur ^= 1;
      ops_.scratch_release(mark);
    }
    seq_tokens_ = {};
    if (rows.empty()) return {};  // a prefill chunk that needs no logits only fills the cache
    const int64_t R = rows.numel();
    Tensor last = ops_.scratch(act, {R, n * D});
    ops_.gather_rows(last, streams[cur], rows);
    // The hyper head: pre weights only, then the final norm.
    Tensor flat = ops_.scratch(act, {R, n * D});
    ops_.rmsnorm(flat, last, ones_.rows(0, n * D), float(cfg_.rms_norm_eps));
    Tensor mix = ops_.scratch(DType::kF32, {R, n});
    ops_.linear(mix, flat, head_hc_.fn);
    Tensor pre = ops_.scratch(DType::kF32, {R, n});
    ops_.hc_weights(pre, {}, {}, mix, head_hc_.base, head_hc_.scale, 1, float(cfg_.v4.hc_eps));
    Tensor collapsed = ops_.scratch(act, {R, D});
    ops_.hc_collapse(collapsed, last, pre);
    Tensor h = ops_.scratch(act, {R, D});
    ops_.rmsnorm(h, collapsed, final_norm_, float(cfg_.rms_norm_eps));
    Tensor lg = ops_.scratch(DType::kF32, {R, cfg_.vocab_size});
    ops_.linear(lg, h, lm_head_);
    return lg;
  }

  std::vector<KvTensorShape> kv_layout() const override { return layout_; }

  std::vector<Layer> layers_;
  HyperConnection head_hc_;
  V4Ropes ropes_;
  Tensor ones_;
  RouterScoring scoring_ = RouterScoring::kSqrtSoftplus;
  Tensor seq_tokens_;  // during step_body: the step's token ids (hash routing)
  // The cache's tensors, and per layer the index of its token tensor and entry tensor (-1: none).
  std::vector<KvTensorShape> layout_;
  std::vector<int> token_tensor_, entry_tensor_;
};

}  // namespace

std::unique_ptr<Model> make_deepseek_v4(const ModelConfig& cfg, WeightSource& src, Ops& ops,
                                        int max_positions) {
  return std::make_unique<DeepseekV4Model>(cfg, src, ops, max_positions);
}

}  // namespace beluga
