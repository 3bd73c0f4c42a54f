#include "model/decode_graphs.h"

#include <algorithm>
#include <bit>

#include "model/batch.h"
#include "util/error.h"

namespace beluga {

namespace {

constexpr int kFields = 5;  // ids, positions, slots, rows, context_len; then query_start, block table

}  // namespace

void read_logits(Ops& ops, const Tensor& logits, float* host, int32_t* greedy, Tensor ids) {
  if (!greedy) {
    ops.copy_to_host(logits, host);
    return;
  }
  ids = ids.empty() ? ops.scratch(DType::kI32, {logits.shape[0]}) : ids.rows(0, logits.shape[0]);
  ops.argmax_rows(ids, logits);
  ops.copy_to_host(ids, greedy);
}

DecodeGraphs::DecodeGraphs(Ops& ops, int max_positions)
    : ops_(ops),
      width_cap_(
          int(std::bit_ceil(unsigned(std::max(1, (max_positions + kKvBlockSize - 1) / kKvBlockSize))))),
      inputs_(ops.alloc_persistent(
          DType::kI32, {int64_t(kFields) * kMaxBatch + kMaxBatch + 1 + int64_t(kMaxBatch) * width_cap_})),
      greedy_ids_(ops.alloc_persistent(DType::kI32, {kMaxBatch})),
      epoch_(ops.scratch_epoch()) {}

DecodeGraphs::~DecodeGraphs() {
  drop();
}

void DecodeGraphs::drop() {
  for (auto& [key, g] : graphs_) ops_.release_graph(g.id);
  graphs_.clear();
}

bool DecodeGraphs::qualifies(const StepPlan& p) {
  if (p.num_seqs < 1 || p.num_seqs > kMaxBatch || p.max_query_len != 1) return false;
  if (int(p.tokens.size()) != p.num_seqs || int(p.logit_rows.size()) != p.num_seqs) return false;
  for (int i = 0; i < p.num_seqs; ++i)
    if (p.logit_rows[size_t(i)] != i) return false;
  return true;
}

int DecodeGraphs::batch_bucket(int n) {
  // Fine steps where decode batches usually sit, coarser above; each bucket is one graph per width.
  static constexpr int kBuckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256};
  for (int b : kBuckets)
    if (n <= b) return b;
  return kMaxBatch;
}

void DecodeGraphs::run(const StepPlan& p, const Body& body, float* logits, int32_t* greedy) {
  const int S = p.num_seqs, B = batch_bucket(S);
  const int W = int(std::bit_ceil(unsigned(std::max(1, p.max_blocks))));
  BELUGA_CHECK(qualifies(p) && W <= width_cap_, "DecodeGraphs: step does not qualify");
  if (ops_.scratch_epoch() != epoch_) {  // scratch was reallocated: recorded addresses are stale
    drop();
    epoch_ = ops_.scratch_epoch();
  }

  // Inputs, padded to B rows: padding rows repeat row 0 (valid cache reads) but write no KV.
  const size_t off_qs = size_t(kFields) * kMaxBatch, off_bt = off_qs + kMaxBatch + 1;
  host_.assign(off_bt + size_t(B) * W, 0);
  for (int i = 0; i < B; ++i) {
    const int src = i < S ? i : 0;
    host_[size_t(0 * kMaxBatch + i)] = p.tokens[size_t(src)];
    host_[size_t(1 * kMaxBatch + i)] = p.positions[size_t(src)];
    host_[size_t(2 * kMaxBatch + i)] = i < S ? p.slots[size_t(i)] : -1;
    host_[size_t(3 * kMaxBatch + i)] = i;
    host_[size_t(4 * kMaxBatch + i)] = p.context_len[size_t(src)];
    host_[off_qs + size_t(i)] = i;
    std::copy_n(p.block_table.begin() + int64_t(src) * p.max_blocks, p.max_blocks,
                host_.begin() + int64_t(off_bt) + int64_t(i) * W);
  }
  host_[off_qs + size_t(B)] = B;
  ops_.copy_from_host(inputs_.rows(0, int64_t(host_.size())), host_.data());

  auto field = [&](size_t off, int64_t n) { return inputs_.rows(int64_t(off), int64_t(off) + n); };
  const Tensor ids = field(0, B), pos = field(kMaxBatch, B), rows = field(3 * size_t(kMaxBatch), B);
  AttnMeta meta;
  meta.num_seqs = B;
  meta.num_tokens = B;
  meta.block_size = kKvBlockSize;
  meta.max_blocks = W;
  meta.slot_mapping = field(2 * size_t(kMaxBatch), B).ptr<const int32_t>();
  meta.positions = pos.ptr<const int32_t>();
  meta.context_len = field(4 * size_t(kMaxBatch), B).ptr<const int32_t>();
  meta.query_start = field(off_qs, B + 1).ptr<const int32_t>();
  meta.block_table = field(off_bt, int64_t(B) * W).ptr<const int32_t>();
  // Host copies describe the bucket, not this step: kernels size their grids for W blocks of keys and
  // read each sequence's real length on the device, so one graph serves every context up to W blocks.
  meta.h_query_start.resize(size_t(B) + 1);
  for (int i = 0; i <= B; ++i) meta.h_query_start[size_t(i)] = i;
  meta.h_context_len.assign(size_t(B), W * kKvBlockSize - 1);

  const auto key = std::make_pair(B, W);
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    ops_.replay(it->second.id);
    // Not scratch: a replay does not advance the scratch cursor, so scratch would alias the graph's.
    read_logits(ops_, it->second.logits.rows(0, S), logits, greedy, greedy_ids_);
    return;
  }
  // First step of this shape: run it eagerly (its result is this step's), then record it.
  Tensor lg = body(meta, ids, pos, rows);
  read_logits(ops_, lg.rows(0, S), logits, greedy);
  ops_.reset_scratch();  // may merge scratch chunks the eager run grew
  if (ops_.scratch_epoch() != epoch_) {
    drop();
    epoch_ = ops_.scratch_epoch();
  }
  ops_.begin_capture();
  Graph g;
  try {
    g.logits = body(meta, ids, pos, rows);
  } catch (...) {
    ops_.release_graph(ops_.end_capture());
    throw;
  }
  g.id = ops_.end_capture();
  BELUGA_CHECK(ops_.scratch_epoch() == epoch_, "DecodeGraphs: scratch reallocated while recording");
  graphs_.emplace(key, g);
}

}  // namespace beluga
