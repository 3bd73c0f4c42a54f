// DecodeGraphs: replays recorded decode steps (CUDA graphs) so a decode step costs one launch instead
// of one per op. A step qualifies when every sequence brings the same number Q of new tokens (1 for
// plain decode, 1 + K for a speculative verify step) and the logit rows are either every row in order
// or one row inside each sequence's own rows (an MTP proposal step). Steps are padded to a batch
// bucket (extra sequences copy sequence 0 and write no KV) and to a power-of-two block-table width,
// and one graph is recorded per (batch bucket, Q, logit-row kind, width, variant) on first use: that
// first step runs eagerly (warming lazy state: cuBLAS, converted weights, expert tables), then is
// captured. `variant` names the fixed addresses the body reads and writes besides its inputs (the KV
// cache, the persistent final-hidden buffer a verify step fills), so a graph never replays against
// another cache or with other side outputs. Inputs live in one
// persistent device buffer the graphs read. Graphs are dropped when the backend reallocates its
// scratch memory (Ops::scratch_epoch).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/ops.h"

namespace beluga {

// One step's inputs on the host, as Model::forward lays them out.
struct StepPlan {
  std::vector<int32_t> tokens, positions, slots, query_start, context_len, logit_rows;
  // MTP steps: the row of the step's hidden input each token row reads (empty: its own row).
  std::vector<int32_t> source_rows;
  std::vector<int32_t> block_table;  // [num_seqs, max_blocks]
  int num_seqs = 0, max_blocks = 1, max_query_len = 0;
};

// The step's device logits [R, vocab] to the host: all of them, or with `greedy` only each row's
// argmax (Ops::argmax_rows, into `ids` [>= R] I32, or scratch when empty), so a greedy step copies R
// ids instead of R x vocab floats.
// With `greedy_prob` also each row's softmax probability of its argmax (Ops::argmax_rows; into
// `probs` [>= R] F32, or scratch when empty).
void read_logits(Ops& ops, const Tensor& logits, float* host, int32_t* greedy, Tensor ids = {},
                 float* greedy_prob = nullptr, Tensor probs = {});

class DecodeGraphs {
 public:
  // The step body: from device inputs to the F32 logits [rows, vocab] of the step's logit rows.
  // `max_query_len` is the step's Q.
  // What else the body reads or writes at fixed addresses (the KV cache, side-output and input
  // buffers): a graph recorded against one engine's cache must never replay against another's.
  using Variant = std::array<const void*, 6>;
  // The body's device inputs: `source_rows` is StepPlan::source_rows (empty when the plan's is).
  struct Inputs {
    AttnMeta meta;
    Tensor ids, positions, logit_rows, source_rows;
    int max_query_len = 0;
  };
  using Body = std::function<Tensor(const Inputs& in)>;

  // `max_positions` bounds the block-table width the input buffer holds.
  DecodeGraphs(Ops& ops, int max_positions);
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  static constexpr int kMaxBatch = 256;   // sequences of one graph
  static constexpr int kMaxTokens = 512;  // token rows of one graph (batch bucket x Q)
  // Query rows per sequence: a verify step's 1 + K (K <= 8). Longer chunks are prefill, whose kernels
  // plan on the host from each sequence's real lengths, so they run eager.
  static constexpr int kMaxQuery = 9;
  // Whether the step can be replayed: uniform query length up to kMaxQuery, logit rows of one of the
  // two kinds, and at most kMaxTokens rows once padded.
  static bool qualifies(const StepPlan& p);
  // The batch bucket a step of `n` sequences is padded to, and the token rows its graph computes
  // (side-output buffers such as final hidden states must hold that many rows).
  static int batch_bucket(int n);
  static int padded_rows(const StepPlan& p) { return batch_bucket(p.num_seqs) * p.max_query_len; }
  // A bound on the logit rows a step of `num_seqs` sequences of up to `max_query_len` rows computes,
  // replayed (padded) or eager: what a buffer the body writes its per-logit-row results into must hold.
  static int64_t logit_rows_bound(int num_seqs, int max_query_len) {
    return int64_t(std::max(num_seqs, batch_bucket(num_seqs))) * max_query_len;
  }
  // Runs the step (replaying or recording its graph) and copies its logits to `logits` (host), or
  // with `greedy` each row's argmax instead (see read_logits).
  // With `device_ids` (I32 on the device, >= the step's token rows) the step's ids come from there: a
  // step chained on the previous one's device output. An unpadded step (its batch a bucket) reads them
  // in place (the graph records their address); a padded one copies them into its input buffer after
  // the host's upload (padding rows keep sequence 0's host ids, valid whatever the device buffer holds).
  void run(const StepPlan& p, const Body& body, float* logits, int32_t* greedy = nullptr,
           Variant variant = {}, float* greedy_prob = nullptr, const Tensor* device_ids = nullptr);
  // As run(), but hands the step's device logits [its logit rows, vocab] to `consume` instead of
  // copying them to the host: the graph's own memory after a replay (so `consume` must take no
  // scratch: a replay does not advance the scratch cursor), or an eager first run's result, consumed
  // before the graph is recorded. A body that keeps its own results (returns no logits) takes no
  // `consume`.
  using Consume = std::function<void(const Tensor& logits)>;
  void run(const StepPlan& p, const Body& body, Variant variant, const Consume& consume,
           const Tensor* device_ids = nullptr);
  int num_graphs() const { return int(graphs_.size()); }
  // Persistent [kMaxTokens] buffers (I32 ids, F32 probabilities) a body may leave its argmaxes in
  // (ForwardOptions::device_greedy): a plain greedy step's, read back after its run.
  const Tensor& greedy_ids() const { return greedy_ids_; }
  const Tensor& greedy_probs() const { return greedy_probs_; }

 private:
  struct Graph {
    int id = -1;
    Tensor logits;  // where the graph leaves its logits
  };
  // (batch bucket, Q, every row a logit row, width, variant, gathers source rows, ids read in place)
  using Key = std::tuple<int, int, bool, int, Variant, bool, const void*>;
  void drop();

  Ops& ops_;
  int width_cap_;  // block-table columns the input buffer holds
  // Persistent I32: ids, positions, slots, logit rows, source rows [kMaxTokens] each, context_len
  // [kMaxBatch], query start [kMaxBatch + 1], then the block table [kMaxBatch, width_cap_].
  Tensor inputs_;
  Tensor greedy_ids_;    // argmax rows of a replayed step
  Tensor greedy_probs_;  // and their probabilities
  std::vector<int32_t> host_;
  std::map<Key, Graph> graphs_;
  uint64_t epoch_ = 0;
};

}  // namespace beluga
