#include "model/model.h"

#include <algorithm>
#include <cstring>

#include "model/rope.h"
#include "util/error.h"

namespace beluga {

std::unique_ptr<Model> make_deepseek(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions);
std::unique_ptr<Model> make_dense(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions);

Model::Model(const ModelConfig& cfg, Ops& ops) : cfg_(cfg), ops_(ops) {}

std::unique_ptr<Model> load_model(const ModelConfig& cfg, WeightSource& src, Ops& ops, int max_positions) {
  if (max_positions <= 0)
    max_positions = std::min(cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 4096, 32768);
  if (cfg.is_mla()) return make_deepseek(cfg, src, ops, max_positions);
  return make_dense(cfg, src, ops, max_positions);
}

Weight Model::load_linear(WeightSource& src, const std::string& prefix, int64_t out, int64_t in) {
  Weight w;
  Tensor host = src.get(prefix + ".weight", {out, in});
  if (host.dtype == DType::kF8E4M3) {
    const int64_t bn = cfg_.fp8_block_n, bk = cfg_.fp8_block_k;
    Tensor s = src.get(prefix + ".weight_scale_inv", {(out + bn - 1) / bn, (in + bk - 1) / bk}, DType::kF32);
    BELUGA_CHECK(s.dtype == DType::kF32, prefix, ".weight_scale_inv must be F32, got ", s.describe());
    w.scale = ops_.upload(s);
    w.block_n = int(bn);
    w.block_k = int(bk);
  } else {
    BELUGA_CHECK(host.dtype == DType::kBF16 || host.dtype == DType::kF32, prefix,
                 ".weight: unsupported dtype ", host.describe());
  }
  w.w = ops_.upload(host);
  Tensor bias = src.find(prefix + ".bias", {out});
  if (!bias.empty()) {
    BELUGA_CHECK(bias.dtype == DType::kBF16 || bias.dtype == DType::kF32, prefix, ".bias: unsupported dtype");
    w.bias = ops_.upload(bias);
    n_params_ += out;
  }
  n_params_ += out * in;
  return w;
}

Tensor Model::load_vector(WeightSource& src, const std::string& name, int64_t n) {
  Tensor t = src.get(name, {n});
  BELUGA_CHECK(t.dtype == DType::kBF16 || t.dtype == DType::kF32, name, ": unsupported dtype ", t.describe());
  n_params_ += n;
  return ops_.upload(t);
}

KvCache Model::make_kv_cache(int num_blocks) const {
  KvCache kv;
  kv.num_blocks = num_blocks;
  for (int l = 0; l < cfg_.num_layers; ++l)
    kv.layers.push_back(
        ops_.alloc_persistent(ops_.act_dtype(), {num_blocks, kKvBlockSize, cfg_.kv_entry_dim()}));
  return kv;
}

size_t Model::kv_bytes_per_token() const {
  return size_t(cfg_.num_layers) * size_t(cfg_.kv_entry_dim()) * dtype_size(ops_.act_dtype());
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
  Tensor residual = hidden;
  Tensor x = ops_.scratch(ops_.act_dtype(), {T, cfg_.hidden_size});
  Tensor delta;
  for (int l = 0; l < cfg_.num_layers; ++l) {
    const LayerNorms n = layer_norms(l);
    if (l == 0) {
      ops_.rmsnorm(x, residual, n.input, eps);
    } else {
      ops_.add_rmsnorm(residual, delta, x, n.input, eps);  // completes layer l-1
      capture(opt, residual);
    }
    Tensor attn = attention(l, x, meta, pos, kv.layers[size_t(l)], opt, max_query_len);
    ops_.add_rmsnorm(residual, attn, x, n.post, eps);
    delta = feed_forward(l, x);
  }
  Tensor out = ops_.scratch(ops_.act_dtype(), {T, cfg_.hidden_size});
  ops_.add_rmsnorm(residual, delta, out, final_norm_, eps);
  capture(opt, residual);
  capture(opt, out);
  return out;
}

void Model::forward(const Batch& b, KvCache& kv, float* logits, const ForwardOptions& opt) {
  ops_.reset_scratch();
  const int T = int(b.tokens.size()), S = int(b.seqs.size());
  BELUGA_CHECK(T > 0, "empty batch");
  BELUGA_CHECK(int(kv.layers.size()) == cfg_.num_layers, "KV cache has the wrong number of layers");

  AttnMeta meta;
  meta.num_seqs = S;
  meta.num_tokens = T;
  meta.block_size = kKvBlockSize;
  meta.h_query_start.assign(S + 1, 0);
  meta.h_context_len.assign(S, 0);
  int max_blocks = 1, max_q = 0;
  for (const auto& s : b.seqs) max_blocks = std::max(max_blocks, int(s.block_table.size()));
  std::vector<int32_t> positions(T), slots(T), table(size_t(S) * max_blocks, 0);
  int row = 0;
  for (int i = 0; i < S; ++i) {
    const SeqChunk& s = b.seqs[i];
    const int total = s.context_len + s.query_len;
    BELUGA_CHECK(s.query_len > 0 && s.context_len >= 0, "sequence ", i, " has no new tokens");
    BELUGA_CHECK(total <= max_positions_, "sequence of ", total, " tokens exceeds the model's ",
                 max_positions_, " positions");
    BELUGA_CHECK(int64_t(s.block_table.size()) * kKvBlockSize >= total, "sequence ", i,
                 ": block table too short for ", total, " tokens");
    for (size_t j = 0; j < s.block_table.size(); ++j) {
      BELUGA_CHECK(s.block_table[j] >= 0 && s.block_table[j] < kv.num_blocks, "block id ", s.block_table[j],
                   " outside the cache");
      table[size_t(i) * max_blocks + j] = s.block_table[j];
    }
    meta.h_query_start[i] = row;
    meta.h_context_len[i] = s.context_len;
    for (int j = 0; j < s.query_len; ++j, ++row) {
      BELUGA_CHECK(row < T, "sequence query lengths exceed the batch's tokens");
      const int p = s.context_len + j;
      positions[row] = p;
      slots[row] = s.block_table[p / kKvBlockSize] * kKvBlockSize + p % kKvBlockSize;
    }
    max_q = std::max(max_q, s.query_len);
  }
  BELUGA_CHECK(row == T, "sequence query lengths (", row, ") do not add up to the batch's ", T, " tokens");
  meta.h_query_start[S] = T;
  for (int t : b.tokens)
    BELUGA_CHECK(t >= 0 && t < cfg_.vocab_size, "token id ", t, " outside the vocabulary (", cfg_.vocab_size,
                 ")");
  for (int r : b.logit_rows) BELUGA_CHECK(r >= 0 && r < T, "logit row ", r, " out of range");

  auto upload_i32 = [&](const std::vector<int32_t>& v) {
    Tensor t = ops_.scratch(DType::kI32, {int64_t(v.size())});
    ops_.copy_from_host(t, v.data());
    return t;
  };
  Tensor ids = upload_i32(std::vector<int32_t>(b.tokens.begin(), b.tokens.end()));
  Tensor pos = upload_i32(positions);
  Tensor qs = upload_i32(meta.h_query_start);
  Tensor cl = upload_i32(meta.h_context_len);
  Tensor bt = upload_i32(table);
  Tensor sl = upload_i32(slots);
  meta.query_start = qs.ptr<const int32_t>();
  meta.context_len = cl.ptr<const int32_t>();
  meta.block_table = bt.ptr<const int32_t>();
  meta.max_blocks = max_blocks;
  meta.slot_mapping = sl.ptr<const int32_t>();
  meta.positions = pos.ptr<const int32_t>();

  Tensor hidden = ops_.scratch(ops_.act_dtype(), {T, cfg_.hidden_size});
  ops_.embedding(hidden, embed_, ids);
  capture(opt, hidden);
  Tensor h = run_layers(hidden, meta, pos, kv, opt, max_q);

  const int R = int(b.logit_rows.size());
  if (R == 0) return;
  Tensor rows = upload_i32(std::vector<int32_t>(b.logit_rows.begin(), b.logit_rows.end()));
  Tensor sel = ops_.scratch(ops_.act_dtype(), {R, cfg_.hidden_size});
  ops_.gather_rows(sel, h, rows);
  Tensor lg = ops_.scratch(DType::kF32, {R, cfg_.vocab_size});
  ops_.linear(lg, sel, lm_head_);
  ops_.copy_to_host(lg, logits);
}

}  // namespace beluga
