// DeepSeek-V4: hybrid attention (deepseek_v4_attention.h) inside manifold-constrained
// hyper-connections (hc_mult residual streams mixed by Sinkhorn-normalized weights around every
// attention and feed-forward block, collapsed by the hyper head before the final norm), and MoE
// feed-forward layers routed by a frozen token -> experts table (hash layers) or sqrtsoftplus top-k.
//
// First slice, no incremental state: the paged cache holds each position's token id, and every step
// recomputes each sequence's whole prefix (cached tokens + new ones) to produce the new rows. Exact,
// and O(prefix) per step. The hybrid cache that replaces it keeps, per layer: token-indexed pages of
// the roped K=V row (only the last sliding_window are read) and of the compressor's (and indexer's)
// kv/gate projections (only the last 2*rate are read: the open window and, for CSA, the one before
// it), and entry-indexed pages (one entry per `rate` tokens) of the pooled K=V and indexer keys; all
// addressed through the sequence's block table, so a cached prefix restores by block reuse.
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
    BELUGA_CHECK(ops.device() == Device::kCpu,
                 "deepseek_v4 runs on the CPU backend only so far (--device cpu); CUDA is not supported yet");
    BELUGA_CHECK(!cfg.fp8, "deepseek_v4: FP8 checkpoints are not supported yet (bf16 weights only)");
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
    std::vector<float> vals(static_cast<size_t>(count));
    if (host.dtype == DType::kF32) {
      for (int64_t i = 0; i < count; ++i) vals[size_t(i)] = host.ptr<const float>()[i];
    } else {
      BELUGA_CHECK(host.dtype == DType::kBF16, name, ": unsupported dtype ", host.describe());
      for (int64_t i = 0; i < count; ++i) vals[size_t(i)] = bf16_to_f32(host.ptr<const uint16_t>()[i]);
    }
    Tensor t = shape.size() == 1 ? ops_.alloc_persistent(DType::kF32, {count})
                                 : ops_.alloc_persistent(DType::kF32, {host.shape[0], count / host.shape[0]});
    ops_.copy_from_host(t, vals.data());
    n_params_ += count;
    return t;
  }

  Tensor load_hash_table(WeightSource& src, const std::string& name, int64_t vocab, int64_t k) {
    Tensor host = src.get(name, {vocab, k}, DType::kI64);
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

  Tensor attention(int l, const NormedInput& in, const AttnMeta&, const Tensor& pos, Tensor,
                   const ForwardOptions&, int) override {
    ops_.normalize(in);
    Tensor out = ops_.scratch(ops_.act_dtype(), {in.out.shape[0], cfg_.hidden_size});
    v4_attention(ops_, cfg_, layers_[size_t(l)].attn, ropes_, in.out, pos, ones_, out);
    return out;
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
    Tensor flat = ops_.scratch(DType::kF32, {T, n * D});
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

  // The final-normed hidden states [T, D] of one sequence's tokens (I32 [T], positions 0..T-1).
  Tensor run_sequence(const Tensor& tokens, const Tensor& pos) {
    const int64_t T = tokens.numel(), n = cfg_.v4.hc_mult, D = cfg_.hidden_size;
    const DType act = ops_.act_dtype();
    Tensor emb = ops_.scratch(act, {T, D});
    ops_.embedding(emb, embed_, tokens);
    Tensor streams[2] = {ops_.scratch(act, {T, n * D}), ops_.scratch(act, {T, n * D})};
    for (int64_t k = 0; k < n; ++k) ops_.copy(streams[0].cols(k * D, (k + 1) * D), emb);
    seq_tokens_ = tokens;
    int cur = 0;
    for (int l = 0; l < cfg_.num_layers; ++l) {
      const Layer& L = layers_[size_t(l)];
      const Ops::ScratchMark mark = ops_.scratch_mark();
      hc_block(L.hc_attn, L.attn_norm, streams[cur], streams[cur ^ 1], [&](const NormedInput& in) {
        return attention(l, in, AttnMeta{}, pos, Tensor{}, ForwardOptions{}, int(T));
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
    // The hyper head: pre weights only, then the final norm.
    Tensor flat = ops_.scratch(DType::kF32, {T, n * D});
    ops_.rmsnorm(flat, streams[cur], ones_.rows(0, n * D), float(cfg_.rms_norm_eps));
    Tensor mix = ops_.scratch(DType::kF32, {T, n});
    ops_.linear(mix, flat, head_hc_.fn);
    Tensor pre = ops_.scratch(DType::kF32, {T, n});
    ops_.hc_weights(pre, {}, {}, mix, head_hc_.base, head_hc_.scale, 1, float(cfg_.v4.hc_eps));
    Tensor collapsed = ops_.scratch(act, {T, D});
    ops_.hc_collapse(collapsed, streams[cur], pre);
    Tensor out = ops_.scratch(act, {T, D});
    ops_.rmsnorm(out, collapsed, final_norm_, float(cfg_.rms_norm_eps));
    return out;
  }

  // Every sequence's new tokens go to the cache (as token ids); each sequence's whole prefix is then
  // recomputed from the cache and its new rows kept.
  Tensor step_body(const AttnMeta& meta, const Tensor& ids, const Tensor&, const Tensor& rows, KvCache& kv,
                   const ForwardOptions& opt, int) override {
    BELUGA_CHECK(!opt.hidden_capture, "deepseek_v4: hidden-state capture is not supported yet");
    const int64_t T = meta.num_tokens, D = cfg_.hidden_size;
    std::vector<int32_t> new_ids(static_cast<size_t>(T));
    ops_.copy_to_host(ids, new_ids.data());
    std::vector<float> as_f(new_ids.begin(), new_ids.end());  // exact: ids < 2^24
    Tensor entries = ops_.scratch(DType::kF32, {T, 1});
    ops_.copy_from_host(entries, as_f.data());
    ops_.cache_write(kv.layers[0], entries, meta);
    int64_t C = 0;
    for (int s = 0; s < meta.num_seqs; ++s)
      C += meta.h_context_len[size_t(s)] + meta.h_query_start[size_t(s) + 1] - meta.h_query_start[size_t(s)];
    Tensor ctx = ops_.scratch(DType::kF32, {C, 1});
    ops_.gather_context(ctx, kv.layers[0], meta);
    std::vector<float> ctx_ids(static_cast<size_t>(C));
    ops_.copy_to_host(ctx, ctx_ids.data());

    // Only sequences with a wanted row run (a prefill chunk that needs no logits only stores its ids).
    std::vector<int32_t> wanted(static_cast<size_t>(rows.empty() ? 0 : rows.numel()));
    if (!wanted.empty()) ops_.copy_to_host(rows, wanted.data());
    Tensor h = ops_.scratch(ops_.act_dtype(), {T, D});
    int64_t off = 0;
    for (int s = 0; s < meta.num_seqs; ++s) {
      const int ctx_len = meta.h_context_len[size_t(s)], q0 = meta.h_query_start[size_t(s)],
                qn = meta.h_query_start[size_t(s) + 1] - q0, len = ctx_len + qn;
      if (std::none_of(wanted.begin(), wanted.end(), [&](int32_t r) { return r >= q0 && r < q0 + qn; })) {
        off += len;
        continue;
      }
      std::vector<int32_t> toks(static_cast<size_t>(len)), at(static_cast<size_t>(len));
      for (int i = 0; i < len; ++i) {
        toks[size_t(i)] = int32_t(ctx_ids[size_t(off + i)]);
        at[size_t(i)] = i;
      }
      off += len;
      const Ops::ScratchMark mark = ops_.scratch_mark();
      Tensor tk = ops_.scratch(DType::kI32, {len}), pos = ops_.scratch(DType::kI32, {len});
      ops_.copy_from_host(tk, toks.data());
      ops_.copy_from_host(pos, at.data());
      Tensor hs = run_sequence(tk, pos);
      ops_.copy(h.rows(q0, q0 + qn), hs.rows(ctx_len, len));
      ops_.scratch_release(mark);
    }
    if (rows.empty()) return {};
    const int64_t R = rows.numel();
    Tensor sel = ops_.scratch(ops_.act_dtype(), {R, D});
    ops_.gather_rows(sel, h, rows);
    Tensor lg = ops_.scratch(DType::kF32, {R, cfg_.vocab_size});
    ops_.linear(lg, sel, lm_head_);
    return lg;
  }

  std::vector<Layer> layers_;
  HyperConnection head_hc_;
  V4Ropes ropes_;
  Tensor ones_;
  RouterScoring scoring_ = RouterScoring::kSqrtSoftplus;
  Tensor seq_tokens_;  // during run_sequence: the tokens of the rows being run
};

}  // namespace

std::unique_ptr<Model> make_deepseek_v4(const ModelConfig& cfg, WeightSource& src, Ops& ops,
                                        int max_positions) {
  return std::make_unique<DeepseekV4Model>(cfg, src, ops, max_positions);
}

}  // namespace beluga
