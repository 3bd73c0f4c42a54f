// ThreadRankPeers: ranks 1 .. N-1 of a group of thread ranks (over a LocalGroup), each with its own
// backend (CPU, or a CUDA device: its thread binds it), model (its part: its experts, its heads) and
// KV cache, stepping with rank 0's model (Model::set_step_peers). Rank 0 is the caller's model, so the
// engine and the generator run unchanged on top of it. How the ranks split the work (RankSplit):
// - Expert parallel, replicated tokens: every rank steps every batch and keeps the same KV cache (each
//   writes the same blocks), so the prefix cache's block reuse stays valid; blocks loaded from the KV
//   tiers go into every rank's cache (copy_blocks; saves read rank 0's, the same).
// - Attention data parallel: each rank holds only its own range of the engine's cache blocks and steps
//   only the sequences there (model/data_parallel_split.h, begin_parts); the MoE layers exchange every
//   rank's own tokens; KV-tier copies go to the rank holding each block (copy_blocks); an MTP step's
//   rows read the hidden states their own rank kept (begin_mtp_parts).
// - Tensor parallel: every rank steps every batch with its heads; a dense model's ranks each cache
//   their own KV heads (a block's image is their slices in rank order), a DeepSeek model's the same
//   latent cache (as replicated expert parallelism).
// A rank that fails aborts the group for good: the step throws on rank 0 (naming the rank that failed
// first and its error), and so does every later step, at once. failure() and on_failure() tell the
// owner, which restarts the instance with the ranks left (cli/serving_engine.h).
// With live EPLB (`live`, shared with rank 0's model), begin() and end() are the group's step
// boundary: no rank steps there, so end() closes the step's statistics (and may start a rebalance's
// preparation) and the next begin() switches every rank to a prepared placement before any runs.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "model/model.h"
#include "parallel/live_placement.h"
#include "parallel/local_communicator.h"

namespace beluga {

// The first failure of a group: the rank that failed (0: the caller's) and its error.
struct RankFailure {
  int rank = -1;
  std::string cause;
};

// Tests of failure handling: rank `rank` (>= 1) throws from its `at_step`-th step (1-based) on.
struct InjectedRankFault {
  int rank = -1;
  uint64_t at_step = 0;
};

// How a group's ranks split the model's work (docs/parallelism.md).
enum class RankSplit {
  kExpertReplicated,       // experts split; every rank steps every token with the same cache
  kDataParallel,           // experts split; each rank steps its own sequences in its own blocks
  kTensorReplicatedCache,  // heads split, the same cache on every rank (DeepSeek: the latent)
  kTensorShardedCache,     // heads split, each rank caching its own KV heads (dense models)
};

class ThreadRankPeers final : public StepPeers {
 public:
  // Rank r's model on its backend (its group's communicator is group.communicator(r)).
  using RankLoader = std::function<std::unique_ptr<Model>(int rank, Ops& ops)>;
  // Loads ranks 1 .. group.size()-1 with `load`, rank r on ops[r - 1] (bound to the calling thread
  // while it loads: rebind rank 0's after). All but data-parallel ranks step every batch rank 0
  // steps; with kTensorShardedCache a block's image is the ranks' slices in rank order
  // (cache_shards()).
  ThreadRankPeers(LocalGroup& group, std::vector<std::unique_ptr<Ops>> ops, const RankLoader& load,
                  RankSplit split, LiveExpertPlacement* live = nullptr, InjectedRankFault fault = {});
  // Expert parallel: rank r loads the experts of its slots of `sharding` from `src` (which may be
  // dropped after). Rank 0's model must be loaded with replicated_tokens = !data_parallel.
  ThreadRankPeers(const ModelConfig& cfg, WeightSource& src, int max_positions, LocalGroup& group,
                  const ExpertSharding& sharding, std::vector<std::unique_ptr<Ops>> ops,
                  LiveExpertPlacement* live = nullptr, InjectedRankFault fault = {},
                  bool data_parallel = false);
  ~ThreadRankPeers() override;

  // The group's failure, once a rank failed (thread-safe).
  std::optional<RankFailure> failure() const;
  // Called once, on the thread that finds the failure (a peer's, or rank 0's inside its step), under
  // a lock: keep it short and do not call back into this object. Null: no call (set it to null before
  // what it calls goes away).
  void on_failure(std::function<void(const RankFailure&)> f);

  void begin(const Batch& b, int num_blocks, bool keep_hidden) override;
  void begin_mtp(const Batch& b, int num_blocks, std::span<const int32_t> rows, bool chained) override;
  bool data_parallel() const override { return data_parallel_; }
  const RankPart& begin_parts(const Batch& b, int num_blocks, const PartOutputs& out,
                              bool keep_hidden) override;
  const RankPart& begin_mtp_parts(const Batch& b, int num_blocks, std::span<const int32_t> hidden_rows,
                                  bool chained, const PartOutputs& out) override;
  std::span<const KvBlockCopy> copy_blocks(std::span<const KvBlockCopy> copies, bool to_host, int num_blocks,
                                           bool with_mtp) override;
  int ranks() const override { return group_.size(); }
  int cache_shards() const override { return sharded_caches_ ? group_.size() : 1; }
  void end() override;
  void abort() override;
  // Rank r's (1 .. group size - 1) caches, between steps (tests).
  const KvCache& kv_of(int rank) const { return peers_[size_t(rank - 1)]->kv; }
  const KvCache& mtp_kv_of(int rank) const { return peers_[size_t(rank - 1)]->mtp_kv; }

 private:
  struct Peer {
    std::unique_ptr<Ops> ops;
    std::unique_ptr<Model> model;
    KvCache kv;
    // MTP steps: the last forward's final hidden states, the MTP step's input rows and its output
    // (each [capacity, hidden]), the MTP cache.
    Tensor hidden, mtp_in, mtp_out;
    KvCache mtp_kv;
    int rank = 0;
    std::thread thread;
    std::exception_ptr error;
  };
  // Records `rank`'s error when that rank is the one that aborted the group first.
  void note_failure(int rank, const std::exception_ptr& error);
  void throw_if_down() const;  // Unavailable once the group failed
  void run(Peer& p);
  // Hands the peers a job over `b` (without its logit rows): `set_job` sets its kind, under the lock.
  void post(const Batch& b, int num_blocks, const std::function<void()>& set_job);
  void step(Peer& p);  // the job begun last, on p's thread
  void wait_done();    // for every peer to finish the job; throws the group's failure
  // p's caches of num_blocks_ blocks (the MTP one when `mtp`), made on first use.
  void ensure_caches(Peer& p, bool mtp) const;

  LocalGroup& group_;
  LiveExpertPlacement* live_;
  const InjectedRankFault fault_;
  mutable std::mutex failure_mu_;
  std::function<void(const RankFailure&)> on_failure_;  // guarded by failure_mu_
  std::optional<RankFailure> failure_;                  // guarded by failure_mu_
  std::vector<std::unique_ptr<Peer>> peers_;
  std::mutex mu_;
  std::condition_variable cv_;
  Batch batch_;  // the step's batch, without logit rows (only rank 0 computes logits)
  int num_blocks_ = 0;
  enum class Job { kForward, kMtp, kLoad, kPart, kMtpPart };
  // Splits `b` into parts_ and starts the peers on them (data parallel).
  const RankPart& post_parts(const PartOutputs& out, int num_blocks, Job job);
  const bool data_parallel_;
  const bool sharded_caches_;
  const char* kind_;             // the group's kind in error messages ("expert-parallel", "tensor-parallel")
  std::vector<RankPart> parts_;  // kPart, kMtpPart: every rank's part of the step (rank 0's first)
  PartOutputs part_out_;         // kPart, kMtpPart: where the parts' rows go
  // Where each token row of the last forward and of the last MTP step went: its rank and its row
  // there (the rows the next MTP step reads).
  struct RowHome {
    int rank = 0, row = 0;
  };
  std::vector<RowHome> forward_rows_, mtp_rows_;
  // A data-parallel step's start: the placement's boundary, then `b` split into parts_; returns the
  // lock to hold while the job is set.
  std::mutex& split_step(const Batch& b, int num_blocks);
  // Where each of the `rows` token rows of the step just split (parts_) went.
  void note_homes(std::vector<RowHome>& homes, size_t rows) const;
  // Posts a kLoad job (the peers' copies between their caches and host images) and waits for it.
  void run_copies(bool to_host, int num_blocks, bool with_mtp);
  Job job_ = Job::kForward;
  std::span<const KvBlockCopy> loads_;                 // kLoad, replicated: the caller's images (it waits)
  bool load_mtp_ = false;                              // kLoad: the images end with the MTP layer's slice
  bool to_host_ = false;                               // kLoad: saves (data parallel), not loads
  std::vector<std::vector<KvBlockCopy>> rank_copies_;  // kLoad, data or tensor parallel: each rank's
  bool keep_hidden_ = false;                           // a forward: keep its final hidden states
  bool chained_ = false;                               // an MTP step: its inputs from the last MTP output
  std::vector<int32_t> rows_;                          // an MTP step's input rows
  uint64_t step_ = 0;                                  // begun jobs
  uint64_t compute_steps_ = 0;                         // of which forwards and MTP steps
  int done_ = 0;                                       // peers done with step_
  bool stop_ = false;
};

// Backends for ranks 1 .. ranks-1 on the CPU, each with `cpu`'s options.
std::vector<std::unique_ptr<Ops>> cpu_peer_ops(int ranks, const CpuOptions& cpu);

}  // namespace beluga
