// DecodeGraphs: replays recorded decode steps (CUDA graphs) so a decode step costs one launch instead
// of one per op. A step qualifies when every sequence brings exactly one new token and wants its
// logits. Steps are padded to a batch bucket (extra rows copy row 0 and write no KV) and to a
// power-of-two block-table width, and one graph is recorded per (batch bucket, width) on first use:
// that first step runs eagerly (warming lazy state: cuBLAS, converted weights, expert tables), then
// is captured. Inputs live in one persistent device buffer the graphs read. Graphs are dropped when
// the backend reallocates its scratch memory (Ops::scratch_epoch).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "backend/ops.h"

namespace beluga {

// One step's inputs on the host, as Model::forward lays them out.
struct StepPlan {
  std::vector<int32_t> tokens, positions, slots, query_start, context_len, logit_rows;
  std::vector<int32_t> block_table;  // [num_seqs, max_blocks]
  int num_seqs = 0, max_blocks = 1, max_query_len = 0;
};

// The step's device logits [R, vocab] to the host: all of them, or with `greedy` only each row's
// argmax (Ops::argmax_rows, into `ids` [>= R] I32, or scratch when empty), so a greedy step copies R
// ids instead of R x vocab floats.
void read_logits(Ops& ops, const Tensor& logits, float* host, int32_t* greedy, Tensor ids = {});

class DecodeGraphs {
 public:
  // The step body: from device inputs to the F32 logits [rows, vocab] of the step's logit rows.
  using Body = std::function<Tensor(const AttnMeta& meta, const Tensor& ids, const Tensor& positions,
                                    const Tensor& logit_rows)>;

  // `max_positions` bounds the block-table width the input buffer holds.
  DecodeGraphs(Ops& ops, int max_positions);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  static constexpr int kMaxBatch = 256;
  // Whether the step can be replayed: all sequences decode one token and every row is a logit row.
  static bool qualifies(const StepPlan& p);
  // Runs the step (replaying or recording its graph) and copies its logits to `logits` (host), or
  // with `greedy` each row's argmax instead (see read_logits).
  void run(const StepPlan& p, const Body& body, float* logits, int32_t* greedy = nullptr);
  int num_graphs() const { return int(graphs_.size()); }

 private:
  struct Graph {
    int id = -1;
    Tensor logits;  // where the graph leaves its logits
  };
  static int batch_bucket(int n);
  void drop();

  Ops& ops_;
  int width_cap_;      // block-table columns the input buffer holds
  Tensor inputs_;      // persistent I32: ids, positions, slots, rows, context_len [kMaxBatch] each, query
                       // start [kMaxBatch + 1], then the block table [kMaxBatch, width_cap_]
  Tensor greedy_ids_;  // argmax rows of a replayed step
  std::vector<int32_t> host_;
  std::map<std::pair<int, int>, Graph> graphs_;  // (batch bucket, width) -> graph
  uint64_t epoch_ = 0;
};

}  // namespace beluga
