#include "model/decode_graphs.h"

#include <algorithm>
#include <bit>

#include "model/batch.h"
#include "util/error.h"

namespace beluga {

namespace {

// Token-row fields (ids, positions, slots, logit rows, source rows) of kMaxTokens each, then
// context_len [kMaxBatch], query_start [kMaxBatch + 1] and the block table.
constexpr int kTokenFields = 5;
constexpr size_t kOffCtx = size_t(kTokenFields) * DecodeGraphs::kMaxTokens;
constexpr size_t kOffQs = kOffCtx + DecodeGraphs::kMaxBatch;
constexpr size_t kOffBt = kOffQs + DecodeGraphs::kMaxBatch + 1;

// Whether every row is a logit row, in order (else: one logit row inside each sequence's rows).
bool all_rows(const StepPlan& p) {
  return int(p.logit_rows.size()) == p.num_seqs * p.max_query_len;
}

}  // namespace

void read_logits(Ops& ops, const Tensor& logits, float* host, int32_t* greedy, Tensor ids, float* greedy_prob,
                 Tensor probs) {
  if (!greedy) {
    ops.copy_to_host(logits, host);
    return;
  }
  const int64_t R = logits.shape[0];
  ids = ids.empty() ? ops.scratch(DType::kI32, {R}) : ids.rows(0, R);
  if (greedy_prob) probs = probs.empty() ? ops.scratch(DType::kF32, {R}) : probs.rows(0, R);
  ops.argmax_rows(ids, logits, greedy_prob ? probs : Tensor{});
  ops.copy_to_host(ids, greedy);
  if (greedy_prob) ops.copy_to_host(probs, greedy_prob);
}

DecodeGraphs::DecodeGraphs(Ops& ops, int max_positions)
    : ops_(ops),
      width_cap_(
          int(std::bit_ceil(unsigned(std::max(1, (max_positions + kKvBlockSize - 1) / kKvBlockSize))))),
      inputs_(ops.alloc_persistent(DType::kI32, {int64_t(kOffBt) + int64_t(kMaxBatch) * width_cap_})),
      greedy_ids_(ops.alloc_persistent(DType::kI32, {kMaxTokens})),
      greedy_probs_(ops.alloc_persistent(DType::kF32, {kMaxTokens})),
      epoch_(ops.scratch_epoch()) {}

DecodeGraphs::~DecodeGraphs() {
  drop();
}

void DecodeGraphs::drop() {
  for (auto& [key, g] : graphs_) ops_.release_graph(g.id);
  graphs_.clear();
}

bool DecodeGraphs::qualifies(const StepPlan& p) {
  const int S = p.num_seqs, Q = p.max_query_len;
  if (S < 1 || S > kMaxBatch || Q < 1 || Q > kMaxQuery || batch_bucket(S) * Q > kMaxTokens) return false;
  if (int(p.tokens.size()) != S * Q) return false;
  if (!p.source_rows.empty() && p.source_rows.size() != p.tokens.size()) return false;
  for (int i = 0; i <= S; ++i)
    if (p.query_start[size_t(i)] != i * Q) return false;
  if (all_rows(p)) {
    for (int r = 0; r < S * Q; ++r)
      if (p.logit_rows[size_t(r)] != r) return false;
    return true;
  }
  if (int(p.logit_rows.size()) != S) return false;
  for (int i = 0; i < S; ++i)
    if (p.logit_rows[size_t(i)] < i * Q || p.logit_rows[size_t(i)] >= (i + 1) * Q) return false;
  return true;
}

int DecodeGraphs::batch_bucket(int n) {
  // Fine steps where decode batches usually sit, coarser above; each bucket is one graph per width.
  static constexpr int kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  for (int b : kBuckets)
    if (n <= b) return b;
  return kMaxBatch;
}

void DecodeGraphs::run(const StepPlan& p, const Body& body, float* logits, int32_t* greedy, Variant variant,
                       float* greedy_prob, const Tensor* device_ids) {
  run(
      p, body, variant,
      [&](const Tensor& lg) {
        read_logits(ops_, lg, logits, greedy, greedy_ids_, greedy_prob, greedy_probs_);
      },
      device_ids);
}

void DecodeGraphs::run(const StepPlan& p, const Body& body, Variant variant, const Consume& consume,
                       const Tensor* device_ids) {
  const int S = p.num_seqs, B = batch_bucket(S), Q = p.max_query_len;
  const int W = int(std::bit_ceil(unsigned(std::max(1, p.max_blocks))));
  BELUGA_CHECK(qualifies(p) && W <= width_cap_, "DecodeGraphs: step does not qualify");
  if (ops_.scratch_epoch() != epoch_) {  // scratch was reallocated: recorded addresses are stale
    drop();
    epoch_ = ops_.scratch_epoch();
  }
  const bool all = all_rows(p), gathers = !p.source_rows.empty();
  const int T = B * Q, R = all ? T : B;  // rows and logit rows of the padded step
  // Unpadded chained steps read their ids where the previous step left them.
  const bool ids_in_place = device_ids && B == S;
  BELUGA_CHECK(!device_ids || device_ids->numel() >= int64_t(S) * Q, "DecodeGraphs: ", device_ids->numel(),
               " device ids for ", S * Q, " rows");

  // Inputs, padded to B sequences: padding sequences repeat sequence 0 (valid cache reads) but write
  // no KV.
  host_.assign(kOffBt + size_t(B) * W, 0);
  for (int i = 0; i < B; ++i) {
    const int src = i < S ? i : 0;
    for (int j = 0; j < Q; ++j) {
      const size_t r = size_t(i) * Q + j, from = size_t(src) * Q + j;
      host_[0 * kMaxTokens + r] = p.tokens[from];
      host_[1 * kMaxTokens + r] = p.positions[from];
      host_[2 * kMaxTokens + r] = i < S ? p.slots[from] : -1;
      if (gathers) host_[4 * kMaxTokens + r] = p.source_rows[from];
    }
    host_[kOffCtx + size_t(i)] = p.context_len[size_t(src)];
    host_[kOffQs + size_t(i)] = i * Q;
    std::copy_n(p.block_table.begin() + int64_t(src) * p.max_blocks, p.max_blocks,
                host_.begin() + int64_t(kOffBt) + int64_t(i) * W);
  }
  for (int r = 0; r < R; ++r)
    host_[3 * size_t(kMaxTokens) + size_t(r)] =
        all ? r : (r < S ? p.logit_rows[size_t(r)] : r * Q + p.logit_rows[0]);
  host_[kOffQs + size_t(B)] = T;
  ops_.copy_from_host(inputs_.rows(0, int64_t(host_.size())), host_.data());

  auto field = [&](size_t off, int64_t n) { return inputs_.rows(int64_t(off), int64_t(off) + n); };
  Inputs in;
  in.ids = ids_in_place ? device_ids->rows(0, T) : field(0, T);
  in.positions = field(kMaxTokens, T);
  in.logit_rows = field(3 * size_t(kMaxTokens), R);
  if (gathers) in.source_rows = field(4 * size_t(kMaxTokens), T);
  in.max_query_len = Q;
  // A padded step's real rows' ids from the device (padding rows keep sequence 0's host ids).
  if (device_ids && !ids_in_place)
    ops_.copy(in.ids.rows(0, int64_t(S) * Q), device_ids->rows(0, int64_t(S) * Q));
  AttnMeta& meta = in.meta;
  meta.num_seqs = B;
  meta.num_tokens = T;
  meta.block_size = kKvBlockSize;
  meta.max_blocks = W;
  meta.slot_mapping = field(2 * size_t(kMaxTokens), T).ptr<const int32_t>();
  meta.positions = in.positions.ptr<const int32_t>();
  meta.context_len = field(kOffCtx, B).ptr<const int32_t>();
  meta.query_start = field(kOffQs, B + 1).ptr<const int32_t>();
  meta.block_table = field(kOffBt, int64_t(B) * W).ptr<const int32_t>();
  // Host copies describe the bucket, not this step: kernels size their grids for W blocks of keys and
  // read each sequence's real length on the device, so one graph serves every context up to W blocks.
  meta.h_query_start.resize(size_t(B) + 1);
  for (int i = 0; i <= B; ++i) meta.h_query_start[size_t(i)] = i * Q;
  meta.h_context_len.assign(size_t(B), W * kKvBlockSize - Q);
  const int real_rows = all ? S * Q : S;

  const Key key{B, Q, all, W, variant, gathers, ids_in_place ? device_ids->data : nullptr};
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    ops_.replay(it->second.id);
    if (consume) consume(it->second.logits.rows(0, real_rows));
    return;
  }
  // First step of this shape: run it eagerly (its result is this step's), then record it.
  Tensor lg = body(in);
  if (consume) consume(lg.rows(0, real_rows));
  ops_.reset_scratch();  // may merge scratch chunks the eager run grew
  if (ops_.scratch_epoch() != epoch_) {
    drop();
    epoch_ = ops_.scratch_epoch();
  }
  ops_.begin_capture();
  Graph g;
  try {
    g.logits = body(in);
  } catch (...) {
    ops_.release_graph(ops_.end_capture());
    throw;
  }
  g.id = ops_.end_capture();
  BELUGA_CHECK(ops_.scratch_epoch() == epoch_, "DecodeGraphs: scratch reallocated while recording");
  graphs_.emplace(key, g);
}

}  // namespace beluga
