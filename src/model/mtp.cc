#include "model/mtp.h"

#include <algorithm>

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

Tensor Model::mtp_body(const DecodeGraphs::Inputs& in, const Tensor& hidden, KvCache& kv,
                       const ForwardOptions& opt) {
  const MtpWeights& m = *mtp_;
  const AttnMeta& meta = in.meta;
  const int64_t T = meta.num_tokens, D = cfg_.hidden_size;
  const DType act = ops_.act_dtype();
  const float eps = float(cfg_.rms_norm_eps);

  // by row: each row continues from the previous pass's argmax at its hidden row.
  MtpInput mi{m.embed.empty() ? embed_ : m.embed,
              opt.ids_from_hidden_rows ? *opt.device_ids : in.ids,
              hidden,
              in.source_rows,
              m.enorm,
              m.hnorm,
              opt.ids_from_hidden_rows,
              eps};
  // Read before opt.final_hidden is written: it may be `hidden` itself.
  Tensor x = ops_.scratch(act, {T, D});
  ops_.mtp_input(x, mi, m.eh_proj);

  // One pre-norm residual decoder layer, as in run_layers.
  const LayerNorms n = layer_norms(m.layer);
  Tensor xn = ops_.scratch(act, {T, D});
  Tensor sum = ops_.scratch(act, {T, D});
  Tensor attn = attention(m.layer, NormedInput{x, {}, n.input, xn, eps, {}}, meta, in.positions, kv.layers[0],
                          opt, in.max_query_len);
  Tensor ff = ops_.scratch(act, {T, D});
  feed_forward(m.layer, NormedInput{x, attn, n.post, xn, eps, sum}, ff);
  // Normed straight into opt.final_hidden when given (`h` was read from it already if it is `hidden`).
  Tensor out = opt.final_hidden ? opt.final_hidden->rows(0, T) : ops_.scratch(act, {T, D});
  ops_.add_rmsnorm(sum, ff, out, m.head_norm, eps);
  if (in.logit_rows.empty()) return {};

  const Weight& head = m.head.w.empty() ? lm_head_ : m.head;
  if (!opt.device_greedy.empty()) {
    keep_greedy(out, in.logit_rows, head, opt);
    return {};
  }
  const int64_t R = in.logit_rows.numel();
  Tensor sel = ops_.scratch(act, {R, D});
  ops_.gather_rows(sel, out, in.logit_rows);
  Tensor lg = ops_.scratch(DType::kF32, {R, cfg_.vocab_size});
  ops_.linear(lg, sel, head);
  return lg;
}

void Model::mtp_forward(const Batch& b, const Tensor& hidden, KvCache& kv, float* logits,
                        const ForwardOptions& opt, const MtpPeerRows* peer_rows) {
  BELUGA_CHECK(mtp_, "the model has no MTP module");
  if (!peers_) return mtp_forward_local(b, hidden, kv, logits, opt);
  if (peers_->data_parallel()) {
    BELUGA_CHECK(peer_rows && !opt.sampling && opt.device_greedy.empty() && !opt.device_ids &&
                     !opt.ids_from_hidden_rows && !opt.hidden_capture,
                 "an attention data-parallel MTP step takes its ids from the host and returns them there");
    const PartOutputs out{logits, opt.greedy_tokens, opt.greedy_probs};
    const RankPart& mine =
        peers_->begin_mtp_parts(b, kv.num_blocks, opt.hidden_rows, peer_rows->chained, out);
    with_peers([&] { mtp_forward_part(mine, hidden, kv, out, opt.final_hidden); });
    return;
  }
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
  StepPlan p = plan_step(b, kv, 1);
  const int64_t T = int64_t(p.tokens.size()), D = cfg_.hidden_size;
  BELUGA_CHECK(hidden.ndim == 2 && hidden.shape[1] == D, "MTP hidden input has the wrong shape");
  const bool by_row = opt.ids_from_hidden_rows;
  BELUGA_CHECK(!by_row || (opt.device_ids && !opt.hidden_rows.empty()),
               "ForwardOptions::ids_from_hidden_rows needs device_ids and hidden_rows");
  if (opt.hidden_rows.empty()) {
    BELUGA_CHECK(hidden.shape[0] >= T, "MTP hidden input has ", hidden.shape[0], " rows for ", T, " tokens");
  } else {
    BELUGA_CHECK(int64_t(opt.hidden_rows.size()) == T, "MTP hidden_rows: ", opt.hidden_rows.size(), " for ",
                 T, " tokens");
    // Each row indexes the hidden input and (by_row) the device ids.
    const int64_t rows = by_row ? std::min(hidden.shape[0], opt.device_ids->numel()) : hidden.shape[0];
    for (int32_t r : opt.hidden_rows)
      BELUGA_CHECK(r >= 0 && r < rows, "MTP hidden row ", r, " outside the input's ", rows, " rows");
    p.source_rows.assign(opt.hidden_rows.begin(), opt.hidden_rows.end());
  }
  // Padded rows read `hidden` too (finite values: the caller's buffers start zeroed), in place or
  // (hidden_rows) through sequence 0's rows.
  const bool graph = !enforce_eager_ && ops_.supports_graphs() && !opt.hidden_capture &&
                     opt.mla_mode != MlaMode::kExpanded && DecodeGraphs::qualifies(p) &&
                     (!p.source_rows.empty() || hidden.shape[0] >= DecodeGraphs::padded_rows(p)) &&
                     (!opt.final_hidden || opt.final_hidden->shape[0] >= DecodeGraphs::padded_rows(p));
  auto body = [&](const DecodeGraphs::Inputs& in) { return mtp_body(in, hidden, kv, opt); };
  if (graph) {
    if (!mtp_graphs_) mtp_graphs_ = std::make_unique<DecodeGraphs>(ops_, max_positions_);
    // The graph reads `hidden` (and by row the device ids) and writes the cache, opt.final_hidden and
    // the device argmaxes at fixed addresses: all name its variant.
    const DecodeGraphs::Variant variant{kv.layers[0].data,
                                        hidden.data,
                                        opt.final_hidden ? opt.final_hidden->data : nullptr,
                                        by_row ? opt.device_ids->data : nullptr,
                                        opt.device_greedy.data,
                                        opt.device_greedy_probs.data};
    const Tensor* ids = by_row ? nullptr : opt.device_ids;  // by row: the body gathers them
    if (!opt.device_greedy.empty())
      mtp_graphs_->run(p, body, variant, nullptr, ids);  // the body leaves the argmaxes in opt.device_greedy
    else
      mtp_graphs_->run(p, body, logits, opt.greedy_tokens, variant, opt.greedy_probs, ids);
    return;
  }
  DecodeGraphs::Inputs in;
  in.meta = upload_meta(p, &in.ids, &in.positions);
  in.max_query_len = p.max_query_len;
  if (opt.device_ids && !by_row) ops_.copy(in.ids, opt.device_ids->rows(0, T));
  auto upload = [&](const std::vector<int32_t>& v) {
    Tensor t = ops_.scratch(DType::kI32, {int64_t(v.size())});
    ops_.copy_from_host(t, v.data());
    return t;
  };
  if (!p.logit_rows.empty()) in.logit_rows = upload(p.logit_rows);
  if (!p.source_rows.empty()) in.source_rows = upload(p.source_rows);
  Tensor lg = body(in);
  if (lg.empty()) return;
  read_logits(ops_, lg, logits, opt.greedy_tokens, {}, opt.greedy_probs);
}

}  // namespace beluga
