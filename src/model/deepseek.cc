// DeepSeek V2/V3: MLA attention over a latent KV cache, and MoE feed-forward layers.
// MLA runs expanded (k_nope and v rebuilt from the cached latents: cheaper for long query chunks) or
// absorbed (W_UK folded into the query, W_UV applied after attention: cheaper for decode). Both read
// the same cache, so a sequence can switch between them from step to step. Tensor parallel
// (model.h: TensorParallelism, with expert parallelism over the same ranks): a rank holds its part of
// the attention heads (q, kv_b by rows; o by columns, summed) and of the dense MLP layers, the whole
// latent cache (every rank writes the same), and the routed experts of its slots.
#include <cmath>
#include <cstring>

#include "model/layers.h"
#include "model/model.h"
#include "model/rope.h"
#include "parallel/live_placement.h"
#include "parallel/shard_weight_source.h"
#include "parallel/tensor_parallel.h"
#include "util/error.h"

namespace beluga {

namespace {

struct MlaWeights {
  // [q_proj (q_lora_rank == 0) or q_a | kv_a_proj_with_mqa]: both read the layer's input, so decode
  // streams them in one product.
  Weight q_kva;
  Weight q_b;
  Tensor q_a_norm;
  Tensor kv_a_norm;
  Weight kv_b;
  Weight o_proj;
  Tensor w_uk_t;  // [H, kv_rank, nope]: W_UK per head, transposed (absorbed query)
  Tensor w_uv;    // [H, v, kv_rank] (absorbed output)
};

struct MoeWeights {
  Weight router;
  Tensor bias;  // e_score_correction_bias (noaux_tc), selection only
  std::vector<ExpertWeights> experts;
  ExpertWeights shared;  // empty when the model has no shared experts
};

struct Layer {
  Tensor input_norm, post_norm;
  MlaWeights attn;
  bool is_moe = false;
  MlpWeights mlp;
  MoeWeights moe;
};

// Whether the checkpoint holds DeepSeek-V3's MTP module (its eh_proj after the main layers).
bool has_mtp_module(const ModelConfig& c, WeightSource& src) {
  const int64_t D = c.hidden_size;
  return c.num_nextn_predict_layers > 0 &&
         !src.find("model.layers." + std::to_string(c.num_layers) + ".eh_proj.weight", {D, 2 * D}).empty();
}

class DeepseekModel final : public Model {
 public:
  DeepseekModel(const ModelConfig& cfg, WeightSource& all, Ops& ops, int max_positions,
                const ExpertParallelism* ep, const TensorParallelism* tp)
      : Model(cfg, ops), tp_(tp ? tp->comm : nullptr), heads_(cfg.num_heads / (tp ? tp->comm->size() : 1)) {
    const auto& c = cfg_;
    BELUGA_CHECK(!tp_ || (ep && ep->comm == tp_ && ep->replicated_tokens),
                 "tensor parallel: a DeepSeek model's "
                 "routed experts split over the same ranks, every rank stepping every token");
    const int part = tp_ ? tp_->rank() : 0, parts = tp_ ? tp_->size() : 1;
    // Expert parallel: this rank's experts only (the source refuses the others').
    std::unique_ptr<ShardWeightSource> shard;
    std::vector<int> held;  // logical experts in slot order
    if (ep) {
      BELUGA_CHECK(ep->comm && ep->sharding, "expert parallelism: no communicator or sharding");
      BELUGA_CHECK(ep->sharding->num_logical() == c.n_routed_experts, "expert parallelism: a sharding of ",
                   ep->sharding->num_logical(), " experts for a model with ", c.n_routed_experts);
      shard = std::make_unique<ShardWeightSource>(all, *ep->sharding, ep->comm->rank());
      held = ep->sharding->local_experts(ep->comm->rank());
      ep_moe_ = std::make_unique<ExpertParallelMoe>(ops, *ep->comm, *ep->sharding);
      ep_replicated_ = ep->replicated_tokens;
      // Its MoE layers plan their exchanges on the host between the ranks' collectives: no recorded
      // graph can hold a step.
      always_eager_ = enforce_eager_ = true;
      live_ = ep->live;
      ep_rank_ = ep->comm->rank();
      BELUGA_CHECK(
          !live_ || (live_->num_experts() == c.n_routed_experts && live_->ranks() == ep->comm->size()),
          "live EPLB: a placement of ", live_ ? live_->num_experts() : 0, " experts over ",
          live_ ? live_->ranks() : 0, " ranks for this model and group");
    } else {
      for (int e = 0; e < c.n_routed_experts; ++e) held.push_back(e);
    }
    WeightSource& src = shard ? *shard : all;
    const int64_t D = c.hidden_size, H = c.num_heads, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim,
                  v = c.v_head_dim, r = c.kv_lora_rank;
    embed_ = ops.upload(src.get("model.embed_tokens.weight", {c.vocab_size, D}));
    n_params_ += int64_t(c.vocab_size) * D;
    // The MTP module's decoder layer follows the main layers (model.layers.{num_hidden_layers}).
    const bool mtp = has_mtp_module(c, src);
    int64_t main_params = 0;  // the MTP module's parameters are not the model's (as transformers counts)
    std::vector<std::vector<ExpertWeights>> live_experts;  // live EPLB: [MoE layer][slot of this rank]
    for (int l = 0; l < c.num_layers + (mtp ? 1 : 0); ++l) {
      if (l == c.num_layers) main_params = n_params_;
      const std::string p = "model.layers." + std::to_string(l) + ".";
      Layer L;
      L.input_norm = load_vector(src, p + "input_layernorm.weight", D);
      L.post_norm = load_vector(src, p + "post_attention_layernorm.weight", D);
      MlaWeights& a = L.attn;
      const std::string kv_a = p + "self_attn.kv_a_proj_with_mqa";
      // Tensor parallel: this rank's heads (rows of q and kv_b, columns of o); the latent's
      // projection (kv_a) and q's low-rank input (q_a) are every rank's.
      const int64_t Hl = heads_;
      if (c.q_lora_rank > 0) {
        a.q_kva = load_stacked(src, {p + "self_attn.q_a_proj", kv_a}, {c.q_lora_rank, r + rope}, D);
        a.q_a_norm = load_vector(src, p + "self_attn.q_a_layernorm.weight", c.q_lora_rank);
        a.q_b =
            load_linear_part(src, p + "self_attn.q_b_proj", H * (nope + rope), c.q_lora_rank, 0, part, parts);
      } else {
        RowPartSource q_part(src, p + "self_attn.q_proj", H * (nope + rope), part, parts, c.fp8_block_n);
        a.q_kva = load_stacked(q_part, {p + "self_attn.q_proj", kv_a}, {Hl * (nope + rope), r + rope}, D);
        n_params_ += (H - Hl) * (nope + rope) * D;  // the whole layer counts, as load_linear_part's parts do
      }
      a.kv_a_norm = load_vector(src, p + "self_attn.kv_a_layernorm.weight", r);
      a.kv_b = load_linear_part(src, p + "self_attn.kv_b_proj", H * (nope + v), r, 0, part, parts);
      a.o_proj = load_linear_part(src, p + "self_attn.o_proj", D, H * v, 1, part, parts);
      absorb(a);
      L.is_moe = c.is_moe_layer(l);
      if (L.is_moe) {
        const int64_t E = c.n_routed_experts, I = c.moe_intermediate_size;
        L.moe.router = load_linear(src, p + "mlp.gate", E, D);
        if (c.topk_method == ModelConfig::TopkMethod::kNoauxTc) {
          Tensor b = src.get(p + "mlp.gate.e_score_correction_bias", {E}, DType::kF32);
          L.moe.bias = ops.upload(b);  // a buffer, not a parameter (as transformers counts)
        }
        if (live_) {  // the placement holds them (its map is `held` in every layer at first)
          BELUGA_CHECK(live_->moe_index(l) == int(live_experts.size()), "live EPLB: MoE layer ", l,
                       " is not the placement's next MoE layer");
          live_experts.emplace_back();
          for (int e : held) live_experts.back().push_back(load_expert(src, l, e, &n_params_));
        } else {
          for (int e : held) L.moe.experts.push_back(load_expert(src, l, e, &n_params_));
        }
        if (c.n_shared_experts > 0) {
          const int64_t Is = I * c.n_shared_experts;
          L.moe.shared = {load_linear(src, p + "mlp.shared_experts.gate_proj", Is, D),
                          load_linear(src, p + "mlp.shared_experts.up_proj", Is, D),
                          load_linear(src, p + "mlp.shared_experts.down_proj", D, Is)};
        }
      } else {
        const int64_t I = c.intermediate_size;
        L.mlp = {load_linear_part(src, p + "mlp.gate_proj", I, D, 0, part, parts),
                 load_linear_part(src, p + "mlp.up_proj", I, D, 0, part, parts),
                 load_linear_part(src, p + "mlp.down_proj", D, I, 1, part, parts)};
      }
      layers_.push_back(std::move(L));
    }
    if (live_)
      live_->attach(
          ep_rank_, [this](WeightSource& from, int l, int e) { return load_expert(from, l, e, nullptr); },
          std::move(live_experts));
    if (mtp) n_params_ = main_params;
    final_norm_ = load_vector(src, "model.norm.weight", D);
    lm_head_ = load_linear(src, "lm_head", c.vocab_size, D);
    if (mtp) {
      const int64_t n = n_params_;
      load_mtp(src);
      n_params_ = n;
    }

    max_positions_ = max_positions;
    std::vector<float> cs, sn;
    rope_tables(c, int(rope), max_positions, &cs, &sn);
    rope_.cos = ops.alloc_persistent(DType::kF32, {max_positions, rope / 2});
    rope_.sin = ops.alloc_persistent(DType::kF32, {max_positions, rope / 2});
    ops.copy_from_host(rope_.cos, cs.data());
    ops.copy_from_host(rope_.sin, sn.data());
    rope_.rotary_dim = int(rope);
    rope_.interleaved = true;
    scale_ = float(c.attention_scale());
    router_.scoring = c.scoring_func == ModelConfig::ScoringFunc::kSigmoid ? RouterScoring::kSigmoid
                                                                           : RouterScoring::kSoftmax;
    router_.top_k = c.num_experts_per_tok;
    router_.n_group = c.topk_method == ModelConfig::TopkMethod::kGreedy ? 1 : c.n_group;
    router_.topk_group = c.topk_method == ModelConfig::TopkMethod::kGreedy ? 1 : c.topk_group;
    router_.group_by_top2_sum = c.topk_method == ModelConfig::TopkMethod::kNoauxTc;
    router_.norm_topk_prob = c.norm_topk_prob;
    router_.routed_scaling_factor = float(c.routed_scaling_factor);
  }

 private:
  // Routed expert e of layer l. A reload (live EPLB, off the step path: `params` null) counts no
  // parameters, so it writes nothing a step reads.
  ExpertWeights load_expert(WeightSource& src, int l, int e, int64_t* params) {
    int64_t none = 0;
    int64_t* n = params ? params : &none;
    const int64_t D = cfg_.hidden_size, I = cfg_.moe_intermediate_size;
    const std::string ep = "model.layers." + std::to_string(l) + ".mlp.experts." + std::to_string(e) + ".";
    if (params) {
      return {load_linear(src, ep + "gate_proj", I, D, n), load_linear(src, ep + "up_proj", I, D, n),
              load_linear(src, ep + "down_proj", D, I, n)};
    }
    // A reload replaces an expert while the rank serves: into memory the expert owns (the backend's
    // own allocations are neither thread-safe nor ever freed), freed with the last placement holding it.
    auto owners = std::make_shared<std::vector<std::shared_ptr<void>>>();
    ExpertWeights w{load_linear_part(src, ep + "gate_proj", I, D, 0, 0, 1, n, owners.get()),
                    load_linear_part(src, ep + "up_proj", I, D, 0, 0, 1, n, owners.get()),
                    load_linear_part(src, ep + "down_proj", D, I, 0, 0, 1, n, owners.get())};
    if (!owners->empty()) w.owner = owners;
    return w;
  }

  // Splits W_kvb [H*(nope+v), r] into W_UK^T [H, r, nope] and W_UV [H, v, r] for the absorbed form.
  // BF16/F32 keep their dtype; FP8 is dequantized to F32 (the reference dequantizes too).
  void absorb(MlaWeights& a) {
    const auto& c = cfg_;
    const int64_t H = heads_, nope = c.qk_nope_head_dim, v = c.v_head_dim, r = c.kv_lora_rank;
    const Tensor& kvb = a.kv_b.w;
    const DType dt = kvb.dtype == DType::kF8E4M3 ? DType::kF32 : kvb.dtype;
    const int64_t rows = H * (nope + v);
    std::vector<float> full(size_t(rows * r));
    std::vector<unsigned char> raw(kvb.nbytes());
    ops_.copy_to_host(kvb, raw.data());
    std::vector<float> scale;
    if (!a.kv_b.scale.empty()) {
      scale.resize(size_t(a.kv_b.scale.numel()));
      ops_.copy_to_host(a.kv_b.scale, scale.data());
    }
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < r; ++k) {
        const int64_t idx = i * r + k;
        float x;
        if (kvb.dtype == DType::kF32)
          x = reinterpret_cast<const float*>(raw.data())[idx];
        else if (kvb.dtype == DType::kBF16)
          x = bf16_to_f32(reinterpret_cast<const uint16_t*>(raw.data())[idx]);
        else
          x = fp8_block_value(raw.data(), scale.data(), i, k, r, a.kv_b.block_n, a.kv_b.block_k);
        full[idx] = x;
      }
    auto store = [&](std::vector<float>& vals, std::initializer_list<int64_t> shape) {
      Tensor t = ops_.alloc_persistent(dt, shape);
      if (dt == DType::kF32) {
        ops_.copy_from_host(t, vals.data());
      } else {
        std::vector<uint16_t> b(vals.size());
        for (size_t i = 0; i < vals.size(); ++i) b[i] = f32_to_bf16(vals[i]);  // exact: values came from bf16
        ops_.copy_from_host(t, b.data());
      }
      return t;
    };
    std::vector<float> uk(size_t(H * r * nope)), uv(size_t(H * v * r));
    for (int64_t h = 0; h < H; ++h) {
      const float* base = full.data() + h * (nope + v) * r;
      for (int64_t d = 0; d < nope; ++d)
        for (int64_t k = 0; k < r; ++k) uk[size_t((h * r + k) * nope + d)] = base[d * r + k];
      std::memcpy(uv.data() + h * v * r, base + nope * r, size_t(v * r) * sizeof(float));
    }
    a.w_uk_t = store(uk, {H, r, nope});
    a.w_uv = store(uv, {H, v, r});
  }

  LayerNorms layer_norms(int l) const override {
    return {layers_[size_t(l)].input_norm, layers_[size_t(l)].post_norm};
  }

  void idle_step(bool mtp) override {
    BELUGA_CHECK(ep_moe_ && !ep_replicated_,
                 "an idle step is a data-parallel expert-parallel rank's (no expert-parallel group)");
    ops_.reset_scratch();
    // Zero rows of this rank's own: each MoE layer still serves the rows the other ranks route to
    // its experts, in layer order as theirs.
    Tensor none = ops_.scratch(ops_.act_dtype(), {1, cfg_.hidden_size}).rows(0, 0);
    const int first = mtp ? cfg_.num_layers : 0, end = mtp ? int(layers_.size()) : cfg_.num_layers;
    BELUGA_CHECK(first < end, "an idle MTP step without an MTP layer");
    for (int l = first; l < end; ++l) {
      const Layer& L = layers_[size_t(l)];
      if (!L.is_moe) continue;
      NormedInput in{none, Tensor{}, L.post_norm, none, float(cfg_.rms_norm_eps), Tensor{}};
      moe(l, L, in, none);
    }
  }

  void feed_forward(int l, const NormedInput& in, Tensor out) override {
    const Layer& L = layers_[size_t(l)];
    if (L.is_moe) {
      moe(l, L, in, out);
    } else {
      run_mlp(ops_, L.mlp, in, out);
      if (tp_) all_reduce_sum(ops_, *tp_, out);
    }
  }

  Tensor attention(int l, const NormedInput& in, const AttnMeta& meta, const Tensor& pos, Tensor cache,
                   const ForwardOptions& opt, int max_query_len) override {
    const auto& c = cfg_;
    const Layer& L = layers_[size_t(l)];
    Ops& ops = ops_;
    const DType act = ops.act_dtype();
    const int64_t T = in.out.shape[0], H = heads_, nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim,
                  v = c.v_head_dim, r = c.kv_lora_rank;
    const MlaWeights& a = L.attn;
    const int64_t qw = c.q_lora_rank > 0 ? c.q_lora_rank : H * (nope + rope);
    Tensor q_kva = ops.scratch(act, {T, qw + r + rope});
    ops.norm_linear(q_kva, in, a.q_kva);
    Tensor q = q_kva.cols(0, qw);
    if (c.q_lora_rank > 0) {
      Tensor qa = ops.scratch(act, {T, c.q_lora_rank});
      ops.rmsnorm(qa, q, a.q_a_norm, float(c.rms_norm_eps));
      q = ops.scratch(act, {T, H * (nope + rope)});
      ops.linear(q, qa, a.q_b);
    }
    const Tensor kva = q_kva.cols(qw, qw + r + rope);
    const float eps = float(c.rms_norm_eps);
    Tensor o = ops.scratch(act, {T, H, v});
    // The sequences whose rows are t0..t1 (metadata m), attended absorbed or expanded. The latent
    // [normed c_kv | rotated k_pe] goes to the cache; the rotated q_pe stays in q3 and, for the
    // absorbed form, also lands in qlat's rope columns.
    auto attend = [&](bool absorbed, const AttnMeta& m, int64_t t0, int64_t t1) {
      const Tensor q3 = split_heads(q.rows(t0, t1), H, nope + rope), kv_in = kva.rows(t0, t1),
                   p = pos.rows(t0, t1);
      Tensor out = o.rows(t0, t1);
      if (absorbed) {
        // The query in latent space: [q_nope W_UK | rotated q_pe] per head.
        Tensor qlat = ops.scratch(act, {t1 - t0, H, r + rope});
        ops.mla_prepare_absorbed(cache, kv_in, a.kv_a_norm, eps, q3.cols(nope, nope + rope),
                                 qlat.cols(r, r + rope), p, rope_, m, qlat.cols(0, r), q3.cols(0, nope),
                                 a.w_uk_t);
        ops.mla_attention_absorbed_uv(out, qlat, cache, m, int(r), scale_, a.w_uv);
        return;
      }
      ops.mla_prepare(cache, kv_in, a.kv_a_norm, eps, q3.cols(nope, nope + rope), Tensor{}, p, rope_, m);
      int64_t C = 0;
      for (int s = 0; s < m.num_seqs; ++s)
        C += m.h_context_len[s] + m.h_query_start[s + 1] - m.h_query_start[s];
      Tensor ctx = ops.scratch(act, {C, r + rope});
      ops.gather_context(ctx, cache, m);
      Tensor kv = ops.scratch(act, {C, H * (nope + v)});
      ops.linear(kv, ctx.cols(0, r), a.kv_b);
      ops.mla_attention_expanded(out, q3, split_heads(kv, H, nope + v), ctx.cols(r, r + rope), m, scale_);
    };
    // Decode steps attend in latent space; long chunks expand k/v once and reuse them per query. A step
    // with both (prompt chunks beside decodes) attends each run of sequences its own way: expanded, every
    // decode would rebuild k/v for its whole context (at batch 64 and 1K contexts, more FLOPs than the
    // prompt's).
    if (opt.mla_mode != MlaMode::kAuto || max_query_len < kAbsorbedBelow) {
      const bool absorbed = opt.mla_mode == MlaMode::kAbsorbed ||
                            (opt.mla_mode == MlaMode::kAuto && max_query_len < kAbsorbedBelow);
      attend(absorbed, meta, 0, T);
    } else {
      auto short_query = [&](int s) {
        return meta.h_query_start[s + 1] - meta.h_query_start[s] < kAbsorbedBelow;
      };
      for (int s0 = 0; s0 < meta.num_seqs;) {
        int s1 = s0 + 1;
        while (s1 < meta.num_seqs && short_query(s1) == short_query(s0)) ++s1;
        if (s0 == 0 && s1 == meta.num_seqs)
          attend(short_query(0), meta, 0, T);
        else
          attend(short_query(s0), slice_meta(ops, meta, s0, s1), meta.h_query_start[s0],
                 meta.h_query_start[s1]);
        s0 = s1;
      }
    }
    Tensor out = ops.scratch(act, {T, c.hidden_size});
    ops.linear(out, merge_heads(o), a.o_proj);
    if (tp_) all_reduce_sum(ops_, *tp_, out);
    return out;
  }

  void moe(int l, const Layer& L, const NormedInput& in, Tensor out) {
    if (ep_moe_) {
      ExpertParallelLayer m{L.moe.router, L.moe.bias, router_, L.moe.experts,
                            L.moe.shared.gate.w.empty() ? nullptr : &L.moe.shared};
      if (live_) {  // this step's placement for the layer, and its statistics
        const int i = live_->moe_index(l);
        m.local_experts = live_->experts(ep_rank_, i);
        m.sharding = &live_->sharding(i);
        m.load = &live_->window(ep_rank_);
        m.load_layer = i;
      }
      if (ep_replicated_)
        ep_moe_->forward_replicated(out, in, m);
      else
        ep_moe_->forward(out, in, m);
      return;
    }
    ops_.moe(out, in,
             {L.moe.router, L.moe.bias, router_, L.moe.experts,
              L.moe.shared.gate.w.empty() ? nullptr : &L.moe.shared});
  }

  // Sequences with fewer query rows than this attend absorbed (decodes, verify steps), the rest expanded.
  static constexpr int kAbsorbedBelow = 16;
  std::vector<Layer> layers_;
  float scale_ = 1.0f;
  RouterParams router_;
  std::unique_ptr<ExpertParallelMoe> ep_moe_;  // expert parallel: this rank's part of each MoE layer
  bool ep_replicated_ = false;
  LiveExpertPlacement* live_ = nullptr;  // live EPLB: the placement the MoE layers read
  int ep_rank_ = 0;
  Communicator* tp_;  // the tensor-parallel group (null: every head here)
  int64_t heads_;     // this rank's attention heads
};

}  // namespace

std::unique_ptr<Model> make_deepseek(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions,
                                     const ExpertParallelism* ep, const TensorParallelism* tp) {
  return std::make_unique<DeepseekModel>(cfg, src, ops, max_positions, ep, tp);
}

std::vector<int> deepseek_moe_layers(const ModelConfig& cfg, WeightSource& src) {
  std::vector<int> out;
  for (int l = 0; l < cfg.num_layers + (has_mtp_module(cfg, src) ? 1 : 0); ++l)
    if (cfg.is_moe_layer(l)) out.push_back(l);
  return out;
}

}  // namespace beluga
