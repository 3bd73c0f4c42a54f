#include "model/mtp.h"

#include "model/model.h"
#include "util/error.h"

namespace beluga {

void Model::load_mtp(WeightSource& src) {
  const int64_t D = cfg_.hidden_size, V = cfg_.vocab_size;
  auto w = std::make_unique<MtpWeights>();
  w->layer = cfg_.num_layers;
  const std::string p = "model.layers." + std::to_string(w->layer) + ".";
  w->enorm = load_vector(src, p + "enorm.weight", D);
  w->hnorm = load_vector(src, p + "hnorm.weight", D);
  w->eh_proj = load_linear(src, p + "eh_proj", D, 2 * D);
  w->head_norm = load_vector(src, p + "shared_head.norm.weight", D);
  // DeepSeek-V3's checkpoints repeat the embedding and head here; smaller ones share the main model's.
  if (Tensor e = src.find(p + "embed_tokens.weight", {V, D}); !e.empty()) w->embed = ops_.upload(e);
  if (!src.find(p + "shared_head.head.weight", {V, D}).empty())
    w->head = load_linear(src, p + "shared_head.head", V, D);
  mtp_ = std::move(w);
}

KvCache Model::make_mtp_kv_cache(int num_blocks) const {
  BELUGA_CHECK(mtp_, "the model has no MTP module");
  KvCache kv;
  kv.num_blocks = num_blocks;
  kv.layers.push_back(
      ops_.alloc_persistent(ops_.act_dtype(), {num_blocks, kKvBlockSize, cfg_.kv_entry_dim()}));
  return kv;
}

size_t Model::mtp_kv_bytes_per_token() const {
  return mtp_ ? size_t(cfg_.kv_entry_dim()) * dtype_size(ops_.act_dtype()) : 0;
}

Tensor Model::mtp_body(const AttnMeta& meta, const Tensor& ids, const Tensor& pos, const Tensor& rows,
                       const Tensor& hidden, KvCache& kv, const ForwardOptions& opt, int max_query_len) {
  const MtpWeights& m = *mtp_;
  const int64_t T = meta.num_tokens, D = cfg_.hidden_size;
  const DType act = ops_.act_dtype();
  const float eps = float(cfg_.rms_norm_eps);

  Tensor emb = ops_.scratch(act, {T, D});
  ops_.embedding(emb, m.embed.empty() ? embed_ : m.embed, ids);
  Tensor cat = ops_.scratch(act, {T, 2 * D});
  ops_.rmsnorm(cat.cols(0, D), emb, m.enorm, eps);
  ops_.rmsnorm(cat.cols(D, 2 * D), hidden.rows(0, T), m.hnorm, eps);
  Tensor x = ops_.scratch(act, {T, D});
  ops_.linear(x, cat, m.eh_proj);

  // One pre-norm residual decoder layer, as in run_layers.
  const LayerNorms n = layer_norms(m.layer);
  Tensor xn = ops_.scratch(act, {T, D});
  Tensor sum = ops_.scratch(act, {T, D});
  Tensor attn = attention(m.layer, NormedInput{x, {}, n.input, xn, eps, {}}, meta, pos, kv.layers[0], opt,
                          max_query_len);
  Tensor ff = ops_.scratch(act, {T, D});
  feed_forward(m.layer, NormedInput{x, attn, n.post, xn, eps, sum}, ff);
  Tensor out = ops_.scratch(act, {T, D});
  ops_.add_rmsnorm(sum, ff, out, m.head_norm, eps);
  if (opt.final_hidden) ops_.copy(opt.final_hidden->rows(0, T), out);
  if (rows.empty()) return {};

  const int64_t R = rows.numel();
  Tensor sel = ops_.scratch(act, {R, D});
  ops_.gather_rows(sel, out, rows);
  Tensor lg = ops_.scratch(DType::kF32, {R, cfg_.vocab_size});
  ops_.linear(lg, sel, m.head.w.empty() ? lm_head_ : m.head);
  return lg;
}

void Model::mtp_forward(const Batch& b, const Tensor& hidden, KvCache& kv, float* logits,
                        const ForwardOptions& opt, const MtpPeerRows* peer_rows) {
  BELUGA_CHECK(mtp_, "the model has no MTP module");
  if (!peers_) return mtp_forward_local(b, hidden, kv, logits, opt);
  // The MTP layer's experts are sharded too: every rank steps it.
  BELUGA_CHECK(peer_rows, "an expert-parallel MTP step needs the peers' input rows");
  // The peers take their ids from the batch: every step's ids must be on the host.
  BELUGA_CHECK(!opt.device_ids, "an expert-parallel MTP step takes its ids from the host");
  peers_->begin_mtp(b, kv.num_blocks, peer_rows->rows, peer_rows->chained);
  with_peers([&] { mtp_forward_local(b, hidden, kv, logits, opt); });
}

void Model::mtp_forward_local(const Batch& b, const Tensor& hidden, KvCache& kv, float* logits,
                              const ForwardOptions& opt) {
  // The caller's hidden rows are persistent; scratch from here on is this step's.
  ops_.reset_scratch();
  const StepPlan p = plan_step(b, kv, 1);
  const int64_t T = int64_t(p.tokens.size()), D = cfg_.hidden_size;
  BELUGA_CHECK(hidden.ndim == 2 && hidden.shape[0] >= T && hidden.shape[1] == D,
               "MTP hidden input has the wrong shape");
  // Padded rows read `hidden` too (finite values: the caller's buffers start zeroed).
  const bool graph = !enforce_eager_ && ops_.supports_graphs() && !opt.hidden_capture &&
                     opt.mla_mode != MlaMode::kExpanded && DecodeGraphs::qualifies(p) &&
                     hidden.shape[0] >= DecodeGraphs::padded_rows(p) &&
                     (!opt.final_hidden || opt.final_hidden->shape[0] >= DecodeGraphs::padded_rows(p));
  if (graph) {
    if (!mtp_graphs_) mtp_graphs_ = std::make_unique<DecodeGraphs>(ops_, max_positions_);
    // The graph reads `hidden` and writes the cache and opt.final_hidden at fixed addresses: all three
    // name its variant.
    const DecodeGraphs::Variant variant{kv.layers[0].data, hidden.data,
                                        opt.final_hidden ? opt.final_hidden->data : nullptr};
    auto body = [&](const AttnMeta& meta, const Tensor& ids, const Tensor& pos, const Tensor& rows, int q) {
      return mtp_body(meta, ids, pos, rows, hidden, kv, opt, q);
    };
    if (!opt.device_greedy.empty())
      mtp_graphs_->run(
          p, body, variant, [&](const Tensor& lg) { keep_greedy(lg, opt); }, opt.device_ids);
    else
      mtp_graphs_->run(p, body, logits, opt.greedy_tokens, variant, opt.greedy_probs, opt.device_ids);
    return;
  }
  Tensor ids, pos;
  const AttnMeta meta = upload_meta(p, &ids, &pos);
  if (opt.device_ids) ops_.copy(ids, opt.device_ids->rows(0, T));
  Tensor rows;
  if (!p.logit_rows.empty()) {
    rows = ops_.scratch(DType::kI32, {int64_t(p.logit_rows.size())});
    ops_.copy_from_host(rows, p.logit_rows.data());
  }
  Tensor lg = mtp_body(meta, ids, pos, rows, hidden, kv, opt, p.max_query_len);
  if (lg.empty()) return;
  if (!opt.device_greedy.empty())
    keep_greedy(lg, opt);
  else
    read_logits(ops_, lg, logits, opt.greedy_tokens, {}, opt.greedy_probs);
}

void Model::keep_greedy(const Tensor& logits, const ForwardOptions& opt) {
  const int64_t R = logits.shape[0];
  BELUGA_CHECK(opt.device_greedy.numel() >= R &&
                   (opt.device_greedy_probs.empty() || opt.device_greedy_probs.numel() >= R),
               "ForwardOptions::device_greedy holds fewer rows than the step's ", R, " logit rows");
  ops_.argmax_rows(opt.device_greedy.rows(0, R), logits,
                   opt.device_greedy_probs.empty() ? Tensor{} : opt.device_greedy_probs.rows(0, R));
}

}  // namespace beluga
