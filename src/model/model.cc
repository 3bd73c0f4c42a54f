#include "model/model.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "model/mtp.h"
#include "model/rope.h"
#include "model/stacked_weight.h"
#include "parallel/tensor_parallel.h"
#include "util/error.h"

namespace beluga {

std::unique_ptr<Model> make_deepseek(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions,
                                     const ExpertParallelism* ep, const TensorParallelism* tp);
std::unique_ptr<Model> make_deepseek_v4(const ModelConfig& cfg, WeightSource& src, Ops& ops,
                                        int max_positions);
std::unique_ptr<Model> make_dense(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions,
                                  const TensorParallelism* tp);

Model::Model(const ModelConfig& cfg, Ops& ops) : cfg_(cfg), ops_(ops) {}

std::unique_ptr<Model> load_model(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions,
                                  const ExpertParallelism* ep, const TensorParallelism* tp) {
  if (max_positions <= 0)
    max_positions = std::min(cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096, 32768);
  BELUGA_CHECK(!ep || (cfg.is_mla() && cfg.arch != Arch::kDeepseekV4 && cfg.n_routed_experts > 0),
               "expert parallelism needs a DeepSeek V2/V3 mixture-of-experts model");
  if (tp) {
    BELUGA_CHECK(tp->comm, "tensor parallelism: no communicator");
    const std::string why = tensor_parallel_refusal(cfg, tp->comm->size());
    BELUGA_CHECK(why.empty(), why);
  }
  if (cfg.arch == Arch::kDeepseekV4) return make_deepseek_v4(cfg, src, ops, max_positions);
  if (cfg.is_mla()) return make_deepseek(cfg, src, ops, max_positions, ep, tp);
  return make_dense(cfg, src, ops, max_positions, tp);
}

int tensor_parallel_restart_size(const ModelConfig& cfg, int healthy_ranks) {
  int n = healthy_ranks;
  while (n > 1 && !tensor_parallel_refusal(cfg, n).empty()) --n;
  return std::max(n, 0);
}

std::string tensor_parallel_refusal(const ModelConfig& cfg, int ranks) {
  if (ranks <= 1) return "";
  if (cfg.arch == Arch::kDeepseekV4) return "--tensor-parallel-size: DeepSeek-V4 is not split in this build";
  if (cfg.is_mla() && cfg.n_routed_experts < ranks)
    return str("--tensor-parallel-size ", ranks,
               " splits the routed experts over the same ranks: the model has ", cfg.n_routed_experts);
  // A DeepSeek model's latent cache is every rank's: only the query heads and the dense MLP split.
  const int64_t kv_heads = cfg.is_mla() ? ranks : cfg.num_kv_heads;
  for (const auto& [what, n] : {std::pair<const char*, int64_t>{"attention heads", cfg.num_heads},
                                {"KV heads", kv_heads},
                                {"intermediate size", cfg.intermediate_size}})
    if (n % ranks != 0)
      return str("--tensor-parallel-size ", ranks, " must divide the model's ", what, " (", n, ")");
  return "";
}

Weight Model::load_linear(WeightSource& src, const std::string& prefix, int64_t out, int64_t in,
                          int64_t* params) {
  return load_linear_part(src, prefix, out, in, 0, 0, 1, params);
}

Weight Model::load_linear_part(WeightSource& src, const std::string& prefix, int64_t out, int64_t in, int dim,
                               int part, int parts, int64_t* params,
                               std::vector<std::shared_ptr<void>>* owners) {
  int64_t& n_params = params ? *params : n_params_;
  const bool split = parts > 1;
  BELUGA_CHECK(!owners || !split || dim == 0, prefix, ": owned uploads of column parts are not supported");
  auto upload = [&](const Tensor& t) {
    if (!owners) return ops_.upload(t);
    Tensor d;
    if (auto owner = ops_.upload_owned(t, &d)) owners->push_back(std::move(owner));
    return d;
  };
  // A column slice is a copy (a row slice a view of the mapping), uploaded into memory of its own:
  // the CPU backend's upload() keeps the host pointer.
  auto upload_slice = [&](const Tensor& t, bool copied) {
    if (!copied) return upload(t);
    Tensor d = ops_.alloc_persistent(t.dtype, {t.shape[0], t.shape[1]});
    ops_.copy_from_host(d, t.data);
    return d;
  };
  Weight w;
  Tensor host = src.get(prefix + ".weight", {out, in});
  int64_t granule = 1;
  std::vector<std::byte> buf, scale_buf;
  std::vector<uint16_t> bf16;
  if (owners && ops_.device() != Device::kCpu && host.dtype != DType::kBF16 && host.device == Device::kCpu) {
    // An owned weight on a device is made BF16 here, the bits the device's one-time conversion gives
    // (value * block scale, rounded to nearest even): that conversion is cached by the weight's
    // address, which a freed and reused expert's memory would alias.
    BELUGA_CHECK(host.dtype == DType::kF32 || host.dtype == DType::kF8E4M3, prefix,
                 ".weight: unsupported dtype ", host.describe());
    BELUGA_CHECK(host.is_contiguous(), prefix, ".weight must be contiguous");
    const int64_t bn = cfg_.fp8_block_n, bk = cfg_.fp8_block_k;
    Tensor s;
    if (host.dtype == DType::kF8E4M3) {
      s = src.get(prefix + ".weight_scale_inv", {(out + bn - 1) / bn, (in + bk - 1) / bk}, DType::kF32);
      BELUGA_CHECK(s.dtype == DType::kF32 && s.is_contiguous(), prefix, ".weight_scale_inv must be F32");
    }
    bf16.resize(size_t(out * in));
    for (int64_t n = 0; n < out; ++n)
      for (int64_t k = 0; k < in; ++k) {
        const float v = host.dtype == DType::kF32 ? host.ptr<const float>()[n * in + k]
                                                  : fp8_block_value(host.ptr<const uint8_t>(),
                                                                    s.ptr<const float>(), n, k, in, bn, bk);
        bf16[size_t(n * in + k)] = f32_to_bf16(v);
      }
    host = Tensor::make(bf16.data(), DType::kBF16, {out, in});
  }
  if (host.dtype == DType::kF8E4M3) {
    const int64_t bn = cfg_.fp8_block_n, bk = cfg_.fp8_block_k;
    Tensor s = src.get(prefix + ".weight_scale_inv", {(out + bn - 1) / bn, (in + bk - 1) / bk}, DType::kF32);
    BELUGA_CHECK(s.dtype == DType::kF32, prefix, ".weight_scale_inv must be F32, got ", s.describe());
    granule = dim == 0 ? bn : bk;
    if (split) s = scale_slice(s, dim, dim == 0 ? out : in, part, parts, granule, scale_buf);
    w.scale = upload_slice(s, split && dim == 1);
    w.block_n = int(bn);
    w.block_k = int(bk);
  } else {
    BELUGA_CHECK(host.dtype == DType::kBF16 || host.dtype == DType::kF32, prefix,
                 ".weight: unsupported dtype ", host.describe());
  }
  if (split) host = host_slice(host, dim, part, parts, buf, granule);
  w.w = upload_slice(host, split && dim == 1);
  Tensor bias = src.find(prefix + ".bias", {out});
  if (!bias.empty()) {
    BELUGA_CHECK(bias.dtype == DType::kBF16 || bias.dtype == DType::kF32, prefix, ".bias: unsupported dtype");
    if (split && dim == 0) {
      const SliceRange r = tensor_part(out, part, parts);
      bias = bias.rows(r.begin, r.end);
    }
    // Row parallel: the ranks' outputs are summed, so one rank adds the bias.
    if (!split || dim == 0 || part == 0) w.bias = upload(bias);
    n_params += out;
  }
  n_params += out * in;
  return w;
}

Weight Model::load_stacked(WeightSource& src, const std::vector<std::string>& prefixes,
                           const std::vector<int64_t>& outs, int64_t in) {
  return beluga::load_stacked(src, ops_, prefixes, outs, in, cfg_.fp8_block_n, cfg_.fp8_block_k, &n_params_);
}

Tensor Model::load_vector(WeightSource& src, const std::string& name, int64_t n) {
  Tensor t = src.get(name, {n});
  BELUGA_CHECK(t.dtype == DType::kBF16 || t.dtype == DType::kF32, name, ": unsupported dtype ", t.describe());
  n_params_ += n;
  return ops_.upload(t);
}

std::vector<Model::KvTensorShape> Model::kv_layout() const {
  return std::vector<KvTensorShape>(size_t(cfg_.num_layers), {kKvBlockSize, cfg_.kv_entry_dim()});
}

KvCache Model::make_kv_cache(int num_blocks) const {
  KvCache kv;
  kv.num_blocks = num_blocks;
  for (const KvTensorShape& t : kv_layout())
    kv.layers.push_back(ops_.alloc_persistent(ops_.act_dtype(), {num_blocks, t.rows_per_block, t.width}));
  return kv;
}

size_t Model::kv_bytes_per_token() const {
  int64_t per_block = 0;
  for (const KvTensorShape& t : kv_layout()) per_block += t.rows_per_block * t.width;
  BELUGA_CHECK(per_block % kKvBlockSize == 0, "KV layout of ", per_block, " values per block is not a whole ",
               "number per token");
  return size_t(per_block / kKvBlockSize) * dtype_size(ops_.act_dtype());
}

void Model::capture(const ForwardOptions& opt, const Tensor& h) {
  if (!opt.hidden_capture || opt.capture_row < 0) return;
  Tensor row = h.rows(opt.capture_row, opt.capture_row + 1);
  Tensor tmp = ops_.scratch(DType::kF32, {1, h.shape[1]});
  ops_.copy(tmp, row);
  std::vector<float> v(size_t(h.shape[1]));
  ops_.copy_to_host(tmp, v.data());
  opt.hidden_capture->push_back(std::move(v));
}

Tensor Model::run_layers(Tensor hidden, const AttnMeta& meta, const Tensor& pos, KvCache& kv,
                         const ForwardOptions& opt, int max_query_len) {
  const float eps = float(cfg_.rms_norm_eps);
  const int64_t T = hidden.shape[0];
  // The residual stream alternates between two buffers: each sublayer's norm reads one and writes
  // the sum into the other, so a kernel that normalizes in every block (Ops::norm_linear) never
  // overwrites rows another block still reads.
  Tensor res[2] = {hidden, ops_.scratch(ops_.act_dtype(), {T, cfg_.hidden_size})};
  int cur = 0;
  auto input = [&](const Tensor& delta, const Tensor& norm, const Tensor& x) {
    if (delta.empty()) return NormedInput{res[cur], {}, norm, x, eps, {}};
    cur ^= 1;
    return NormedInput{res[cur ^ 1], delta, norm, x, eps, res[cur]};
  };
  Tensor x = ops_.scratch(ops_.act_dtype(), {T, cfg_.hidden_size});
  // The feed-forward output carried into the next layer; everything else a layer takes from scratch
  // is handed back when the layer ends, so a step's scratch is one layer's, not num_layers'.
  Tensor delta = ops_.scratch(ops_.act_dtype(), {T, cfg_.hidden_size});
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const LayerNorms n = layer_norms(l);
    const Ops::ScratchMark mark = ops_.scratch_mark();
    // Adding layer l-1's output completes it; attention's first op does that.
    Tensor attn = attention(l, input(l == 0 ? Tensor{} : delta, n.input, x), meta, pos, kv.layers[size_t(l)],
                            opt, max_query_len);
    if (l > 0) capture(opt, res[cur]);
    feed_forward(l, input(attn, n.post, x), delta);
    ops_.scratch_release(mark);
  }
  Tensor out = ops_.scratch(ops_.act_dtype(), {T, cfg_.hidden_size});
  ops_.add_rmsnorm(res[cur], delta, out, final_norm_, eps);
  capture(opt, res[cur]);
  capture(opt, out);
  return out;
}

Model::~Model() = default;

StepPlan Model::plan_step(const Batch& b, const KvCache& kv, int layers) const {
  const int T = int(b.tokens.size()), S = int(b.seqs.size());
  BELUGA_CHECK(T > 0, "empty batch");
  BELUGA_CHECK(layers < 0 ? kv.layers.size() == kv_layout().size() : int(kv.layers.size()) == layers,
               "KV cache has the wrong number of tensors");
  StepPlan p;
  p.num_seqs = S;
  for (const auto& s : b.seqs) p.max_blocks = std::max(p.max_blocks, int(s.block_table.size()));
  p.query_start.assign(size_t(S) + 1, 0);
  p.context_len.assign(size_t(S), 0);
  p.positions.resize(size_t(T));
  p.slots.resize(size_t(T));
  p.block_table.assign(size_t(S) * size_t(p.max_blocks), 0);
  int row = 0;
  for (int i = 0; i < S; ++i) {
    const SeqChunk& s = b.seqs[size_t(i)];
    const int total = s.context_len + s.query_len;
    BELUGA_CHECK(s.query_len > 0 && s.context_len >= 0, "sequence ", i, " has no new tokens");
    BELUGA_CHECK(total <= max_positions_, "sequence of ", total, " tokens exceeds the model's ",
                 max_positions_, " positions");
    BELUGA_CHECK(int64_t(s.block_table.size()) * kKvBlockSize >= total, "sequence ", i,
                 ": block table too short for ", total, " tokens");
    for (size_t j = 0; j < s.block_table.size(); ++j) {
      BELUGA_CHECK(s.block_table[j] >= 0 && s.block_table[j] < kv.num_blocks, "block id ", s.block_table[j],
                   " outside the cache");
      p.block_table[size_t(i) * size_t(p.max_blocks) + j] = s.block_table[j];
    }
    p.query_start[size_t(i)] = row;
    p.context_len[size_t(i)] = s.context_len;
    for (int j = 0; j < s.query_len; ++j, ++row) {
      BELUGA_CHECK(row < T, "sequence query lengths exceed the batch's tokens");
      const int pos = s.context_len + j;
      p.positions[size_t(row)] = pos;
      p.slots[size_t(row)] = s.block_table[size_t(pos / kKvBlockSize)] * kKvBlockSize + pos % kKvBlockSize;
    }
    p.max_query_len = std::max(p.max_query_len, s.query_len);
  }
  BELUGA_CHECK(row == T, "sequence query lengths (", row, ") do not add up to the batch's ", T, " tokens");
  p.query_start[size_t(S)] = T;
  for (int t : b.tokens)
    BELUGA_CHECK(t >= 0 && t < cfg_.vocab_size, "token id ", t, " outside the vocabulary (", cfg_.vocab_size,
                 ")");
  for (int r : b.logit_rows) BELUGA_CHECK(r >= 0 && r < T, "logit row ", r, " out of range");
  p.tokens.assign(b.tokens.begin(), b.tokens.end());
  p.logit_rows.assign(b.logit_rows.begin(), b.logit_rows.end());
  return p;
}

AttnMeta Model::upload_meta(const StepPlan& p, Tensor* ids, Tensor* pos) {
  auto upload_i32 = [&](const std::vector<int32_t>& v) {
    Tensor t = ops_.scratch(DType::kI32, {int64_t(v.size())});
    ops_.copy_from_host(t, v.data());
    return t;
  };
  AttnMeta meta;
  meta.num_seqs = p.num_seqs;
  meta.num_tokens = int(p.tokens.size());
  meta.block_size = kKvBlockSize;
  meta.h_query_start = p.query_start;
  meta.h_context_len = p.context_len;
  *ids = upload_i32(p.tokens);
  *pos = upload_i32(p.positions);
  meta.query_start = upload_i32(p.query_start).ptr<const int32_t>();
  meta.context_len = upload_i32(p.context_len).ptr<const int32_t>();
  meta.block_table = upload_i32(p.block_table).ptr<const int32_t>();
  meta.max_blocks = p.max_blocks;
  meta.h_block_table = p.block_table;
  meta.slot_mapping = upload_i32(p.slots).ptr<const int32_t>();
  meta.positions = pos->ptr<const int32_t>();
  return meta;
}

Tensor Model::step_body(const AttnMeta& meta, const Tensor& ids, const Tensor& pos, const Tensor& rows,
                        KvCache& kv, const ForwardOptions& opt, int max_query_len) {
  Tensor hidden = ops_.scratch(ops_.act_dtype(), {meta.num_tokens, cfg_.hidden_size});
  ops_.embedding(hidden, embed_, ids);
  capture(opt, hidden);
  Tensor h = run_layers(hidden, meta, pos, kv, opt, max_query_len);
  if (opt.final_hidden) ops_.copy(opt.final_hidden->rows(0, meta.num_tokens), h);
  if (rows.empty()) return {};
  if (!opt.device_greedy.empty()) {
    keep_greedy(h, rows, lm_head_, opt);
    return {};
  }
  const int64_t R = rows.numel();
  Tensor sel = ops_.scratch(ops_.act_dtype(), {R, cfg_.hidden_size});
  ops_.gather_rows(sel, h, rows);
  Tensor lg = ops_.scratch(DType::kF32, {R, cfg_.vocab_size});
  ops_.linear(lg, sel, lm_head_);
  return lg;
}

void Model::keep_greedy(const Tensor& x, const Tensor& rows, const Weight& head, const ForwardOptions& opt) {
  const int64_t R = rows.numel();
  BELUGA_CHECK(opt.device_greedy.numel() >= R &&
                   (opt.device_greedy_probs.empty() || opt.device_greedy_probs.numel() >= R),
               "ForwardOptions::device_greedy holds fewer rows than the step's ", R, " logit rows");
  ops_.head_argmax(opt.device_greedy.rows(0, R),
                   opt.device_greedy_probs.empty() ? Tensor{} : opt.device_greedy_probs.rows(0, R), x, rows,
                   head);
}

void Model::set_sampler(std::unique_ptr<SampleRowsOp> sampler) {
  sampler_ = std::move(sampler);
  sample_graphs_.reset();
  if (!sampler_) return;
  // Full size at once: a recorded graph keeps these addresses.
  const int64_t words = (cfg_.vocab_size + 31) / 32;
  sample_params_ = ops_.alloc_persistent(DType::kI32, {kMaxSampleRows, int64_t(sizeof(DeviceSampleRow) / 4)});
  sample_masks_ = ops_.alloc_persistent(DType::kI32, {kMaxMaskRows, words});
  sampled_out_ = ops_.alloc_persistent(DType::kI32, {kMaxSampleRows, kSampleOutCols});
  sample_edits_ = ops_.alloc_persistent(DType::kI32, {kMaxSampleEdits, int64_t(sizeof(DeviceLogitEdit) / 4)});
  sample_edit_raw_ = ops_.alloc_persistent(DType::kF32, {kMaxSampleEdits});
  sample_lse_ = ops_.alloc_persistent(DType::kF32, {kMaxSampleRows});
}

void Model::finish_sampling(const Tensor& lg, float* logits, const ForwardOptions& opt) {
  if (!opt.before_sampling()) {
    ops_.copy_to_host(lg, logits);
    return;
  }
  upload_sampling(*opt.sampling, size_t(lg.shape[0]));
  const Tensor out = sampled_out_.rows(0, lg.shape[0]);
  sampler_->sample_rows(out, lg, sample_params_, sample_masks_, sample_edit_args());
  ops_.copy_to_host(out, opt.sampled);
}

void Model::upload_sampling(const DeviceSampling& s, size_t logit_rows) {
  const int64_t words = (cfg_.vocab_size + 31) / 32;
  BELUGA_CHECK(sampler_, "device sampling without a sampler (Model::set_sampler)");
  BELUGA_CHECK(s.rows.size() == logit_rows && s.rows.size() <= size_t(kMaxSampleRows),
               "device sampling: ", s.rows.size(), " rows for ", logit_rows, " logit rows (at most ",
               kMaxSampleRows, ")");
  BELUGA_CHECK(s.masks.size() % size_t(words) == 0 && s.masks.size() / size_t(words) <= size_t(kMaxMaskRows),
               "device sampling: masks are not [M <= ", kMaxMaskRows, ", ", words, "] words");
  const int64_t M = int64_t(s.masks.size()) / words;
  const int64_t E = int64_t(s.edits.size());
  BELUGA_CHECK(s.pending.empty(), "device sampling: pending edits not resolved");
  BELUGA_CHECK(E <= kMaxSampleEdits, "device sampling: ", E, " logit edits (at most ", kMaxSampleEdits, ")");
  for (const DeviceSampleRow& r : s.rows) {
    BELUGA_CHECK(r.mask_row < M, "device sampling: mask row ", r.mask_row, " of ", M);
    BELUGA_CHECK(r.edit_begin >= 0 && r.edit_count >= 0 && int64_t(r.edit_begin) + r.edit_count <= E,
                 "device sampling: edits [", r.edit_begin, ", +", r.edit_count, ") of ", E);
  }
  // Only this step's rows: rows past them (a graph's padding) read older, still well-formed ones.
  if (!s.rows.empty()) ops_.copy_from_host(sample_params_.rows(0, int64_t(s.rows.size())), s.rows.data());
  if (M > 0) ops_.copy_from_host(sample_masks_.rows(0, M), s.masks.data());
  if (E > 0) ops_.copy_from_host(sample_edits_.rows(0, E), s.edits.data());
}

Tensor Model::sample_logits(const Tensor& lg) {
  Tensor out = ops_.scratch(DType::kI32, {lg.shape[0], kSampleOutCols});
  sampler_->sample_rows(out, lg, sample_params_, sample_masks_, sample_edit_args());
  return out;
}

void Model::forward(const Batch& b, KvCache& kv, float* logits, const ForwardOptions& opt) {
  if (!peers_) return forward_local(b, kv, logits, opt);
  if (peers_->data_parallel()) {
    // Each rank's rows come back to the host: the step's outputs are gathered there.
    BELUGA_CHECK(!opt.sampling && opt.device_greedy.empty() && !opt.device_ids && !opt.hidden_capture &&
                     opt.hidden_rows.empty(),
                 "an attention data-parallel step returns logits or greedy ids to the host only");
    const PartOutputs out{logits, opt.greedy_tokens, opt.greedy_probs};
    const RankPart& mine = peers_->begin_parts(b, kv.num_blocks, out, opt.final_hidden != nullptr);
    with_peers([&] { forward_part(mine, kv, out, opt.final_hidden); });
    return;
  }
  peers_->begin(b, kv.num_blocks, opt.final_hidden != nullptr);
  with_peers([&] { forward_local(b, kv, logits, opt); });
}

void Model::forward_part(const RankPart& part, KvCache& kv, const PartOutputs& out, Tensor* final_hidden) {
  if (part.batch.tokens.empty()) return idle_step(false);
  run_part(part, out, [&](float* logits, ForwardOptions& opt) {
    opt.final_hidden = final_hidden;
    forward_local(part.batch, kv, logits, opt);
  });
}

void Model::mtp_forward_part(const RankPart& part, const Tensor& hidden, KvCache& kv, const PartOutputs& out,
                             Tensor* final_hidden) {
  if (part.batch.tokens.empty()) return idle_step(true);
  run_part(part, out, [&](float* logits, ForwardOptions& opt) {
    opt.hidden_rows = part.source_rows;
    opt.final_hidden = final_hidden;
    mtp_forward_local(part.batch, hidden, kv, logits, opt);
  });
}

void Model::run_part(const RankPart& part, const PartOutputs& out,
                     const std::function<void(float* logits, ForwardOptions& opt)>& run) {
  const size_t R = part.logit_index.size(), V = size_t(cfg_.vocab_size);
  ForwardOptions opt;
  float* logits = nullptr;
  if (out.greedy_tokens) {
    part_ids_.resize(R);
    part_probs_.resize(R);
    opt.greedy_tokens = part_ids_.data();
    opt.greedy_probs = out.greedy_probs ? part_probs_.data() : nullptr;
  } else if (out.logits) {
    part_logits_.resize(R * V);
    logits = part_logits_.data();
  }
  run(logits, opt);
  for (size_t i = 0; i < R; ++i) {
    const size_t g = size_t(part.logit_index[i]);
    if (out.greedy_tokens) {
      out.greedy_tokens[g] = part_ids_[i];
      if (out.greedy_probs) out.greedy_probs[g] = part_probs_[i];
    } else if (out.logits) {
      std::copy_n(part_logits_.data() + i * V, V, out.logits + g * V);
    }
  }
}

void Model::idle_step(bool) {
  throw Error(str(cfg_.model_type, " cannot take part in an attention data-parallel step"));
}

void Model::with_peers(const std::function<void()>& step) {
  try {
    step();
  } catch (...) {
    peers_->abort();
    // end() throws the group's first failure: a peer's, whose abort made this rank's collectives
    // throw, or this rank's own (the peers' errors then follow from it).
    const std::exception_ptr own = std::current_exception();
    peers_->end();
    std::rethrow_exception(own);
  }
  peers_->end();
}

void Model::forward_local(const Batch& b, KvCache& kv, float* logits, const ForwardOptions& opt) {
  ops_.reset_scratch();
  const StepPlan p = plan_step(b, kv);
  // A verify step's final hidden states are written by the graph too, into the caller's persistent
  // buffer (the graph's variant), which must hold the padded rows.
  const bool graph = !enforce_eager_ && ops_.supports_graphs() && !opt.hidden_capture &&
                     opt.mla_mode != MlaMode::kExpanded && DecodeGraphs::qualifies(p) &&
                     (!opt.final_hidden || opt.final_hidden->shape[0] >= DecodeGraphs::padded_rows(p));
  last_graphed_ = graph;
  if (opt.sampling) {
    BELUGA_CHECK(opt.sampled, "ForwardOptions::sampling needs `sampled`");
    BELUGA_CHECK(p.logit_rows.size() <= size_t(kMaxSampleRows), "device sampling: ", p.logit_rows.size(),
                 " logit rows (at most ", kMaxSampleRows, ")");
    if (!opt.before_sampling) upload_sampling(*opt.sampling, p.logit_rows.size());
  }
  // The graph writes the cache, opt.final_hidden and the device argmaxes at fixed addresses.
  const DecodeGraphs::Variant variant{kv.layers[0].data,
                                      opt.final_hidden ? opt.final_hidden->data : nullptr,
                                      nullptr,
                                      nullptr,
                                      opt.device_greedy.data,
                                      opt.device_greedy_probs.data};
  auto body = [&](const DecodeGraphs::Inputs& in) {
    return step_body(in.meta, in.ids, in.positions, in.logit_rows, kv, opt, in.max_query_len);
  };
  if (graph && opt.sampling && opt.before_sampling) {  // the forward's graph, then the sampler after the wait
    if (!graphs_) graphs_ = std::make_unique<DecodeGraphs>(ops_, max_positions_);
    graphs_->run(p, body, variant, [&](const Tensor& lg) { finish_sampling(lg, logits, opt); });
    return;
  }
  if (graph && opt.sampling) {
    if (!sample_graphs_) sample_graphs_ = std::make_unique<DecodeGraphs>(ops_, max_positions_);
    // The body's output is the sampled rows: DecodeGraphs copies them back as it would logits (bytes).
    sample_graphs_->run(
        p, [&](const DecodeGraphs::Inputs& in) { return sample_logits(body(in)); },
        reinterpret_cast<float*>(opt.sampled), nullptr, variant);
    return;
  }
  if (graph) {
    if (!graphs_) graphs_ = std::make_unique<DecodeGraphs>(ops_, max_positions_);
    if (!opt.device_greedy.empty()) {
      graphs_->run(p, body, variant, nullptr);  // the body leaves the argmaxes in opt.device_greedy
    } else if (opt.greedy_tokens) {
      // The head's GEMV and the argmax inside the graph too (no logits; head_argmax), into the
      // graphs' own buffers, read back after the run: one replay, then the ids.
      ForwardOptions in_graph = opt;
      in_graph.device_greedy = graphs_->greedy_ids();
      in_graph.device_greedy_probs = opt.greedy_probs ? graphs_->greedy_probs() : Tensor{};
      DecodeGraphs::Variant v = variant;
      v[4] = in_graph.device_greedy.data;
      v[5] = in_graph.device_greedy_probs.data;
      graphs_->run(
          p,
          [&](const DecodeGraphs::Inputs& in) {
            return step_body(in.meta, in.ids, in.positions, in.logit_rows, kv, in_graph, in.max_query_len);
          },
          v, nullptr);
      const int64_t R = int64_t(p.logit_rows.size());
      ops_.copy_to_host(in_graph.device_greedy.rows(0, R), opt.greedy_tokens);
      if (opt.greedy_probs) ops_.copy_to_host(in_graph.device_greedy_probs.rows(0, R), opt.greedy_probs);
    } else {
      graphs_->run(p, body, logits, nullptr, variant);
    }
    return;
  }

  Tensor ids, pos;
  const AttnMeta meta = upload_meta(p, &ids, &pos);
  // A prefill chunk that needs no logits only writes its KV.
  Tensor rows;
  if (!p.logit_rows.empty()) {
    rows = ops_.scratch(DType::kI32, {int64_t(p.logit_rows.size())});
    ops_.copy_from_host(rows, p.logit_rows.data());
  }
  Tensor lg = step_body(meta, ids, pos, rows, kv, opt, p.max_query_len);
  if (lg.empty()) return;
  if (opt.sampling && opt.before_sampling)
    finish_sampling(lg, logits, opt);
  else if (opt.sampling)
    ops_.copy_to_host(sample_logits(lg), opt.sampled);
  else
    read_logits(ops_, lg, logits, opt.greedy_tokens, {}, opt.greedy_probs);
}

}  // namespace beluga
