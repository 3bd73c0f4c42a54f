// Live EPLB (issue #27): the expert placement an expert-parallel group serves with, per MoE layer,
// and its rebalancing while serving. It holds, for every MoE layer, the group's slot map (the
// ExpertSharding each rank's ExpertParallelMoe routes that layer by) and every rank's expert weights
// in slot order, plus one ExpertLoadWindow per rank (each rank counts the routing it computes: with
// replicated tokens a rank routes only its own slice of the step, so no single rank sees it all).
// Ranks read the placement during a step; it changes only between steps, on the thread that drives
// them (rank 0's step boundary: before_step / after_step), so every rank of a step sees one
// placement and a rank never sees half a switch.
// A rebalance: every interval_steps closed steps, the ranks' windows are summed, DeepSeek's EPLB plans
// the slots (eplb.h), the plan is aligned to the current placement (ExpertPlacement::aligned_to) so
// only slots whose expert changes load weights, and the new maps and weights are built (prepare):
// on a background thread by default, off the step path; the next step boundary after it finishes
// switches all ranks at once (a swap of one pointer per rank and layer) and logs one info line; a
// plan that would not lower the window's max/mean rank load is dropped (logged) instead.
// Weights of a changed slot are loaded from the checkpoint's WeightSource, kept open by the caller,
// through the loader each rank's model registers (the same code as the model's own load, so a
// replica's bits equal the original's, FP8 scales included). On the CPU backend a "load" is a view of
// the mapped checkpoint (Ops::upload is the identity), so a rebalance copies nothing.
// Not for DeepSeek-V4 (its MoE does not run expert parallel).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "backend/ops.h"
#include "loader/weight_source.h"
#include "parallel/eplb.h"
#include "parallel/expert_load.h"
#include "parallel/expert_placement.h"
#include "parallel/shard.h"

namespace beluga {

struct LiveEplbOptions {
  int redundant_per_rank = 0;  // extra slots per rank (0: each expert once, the contiguous layout)
  int interval_steps = 0;      // rebalance after every this many closed steps (0: never)
  int window_steps = 1000;     // the statistics window, in steps
  bool background = true;      // prepare a rebalance on a thread of its own (false: at the boundary)
};

// One rebalance, as logged. Loads are per rank on the window (replicas splitting an expert's tokens
// evenly, as EPLB assumes): max / mean over the ranks, averaged over the MoE layers.
struct RebalanceReport {
  int64_t step = 0;           // closed steps when it was planned
  int64_t moved_slots = 0;    // slots whose expert changed, over all layers
  int64_t window_tokens = 0;  // routed (token, expert) pairs the plan saw
  double before_max_over_mean = 0, after_max_over_mean = 0;
  double prepare_ms = 0;  // plan, alignment and weight loads (off the step path when background)
  double switch_us = 0;   // the step boundary's part: the swap
};

class LiveExpertPlacement {
 public:
  // `moe_layers`: the model's MoE layer ids (MTP's included), ascending; `experts` routed experts
  // over `ranks` ranks, which must divide them.
  LiveExpertPlacement(std::vector<int> moe_layers, int experts, int ranks, LiveEplbOptions options);
  ~LiveExpertPlacement();  // waits for a preparation in flight
  LiveExpertPlacement(const LiveExpertPlacement&) = delete;
  LiveExpertPlacement& operator=(const LiveExpertPlacement&) = delete;

  int ranks() const { return ranks_; }
  int num_experts() const { return experts_; }
  const LiveEplbOptions& options() const { return opt_; }
  const std::vector<int>& moe_layers() const { return moe_layers_; }
  int moe_index(int layer) const;  // -1: not a MoE layer
  // The initial placement's map, the same in every layer (what the model loads by).
  const ExpertSharding& initial_sharding() const { return *initial_; }

  // ---- read by the ranks during a step ----
  const ExpertSharding& sharding(int moe) const { return *state_->shardings[size_t(moe)]; }
  std::span<const ExpertWeights> experts(int rank, int moe) const {
    return state_->experts[size_t(rank)][size_t(moe)];
  }
  parallel::ExpertLoadWindow& window(int rank) { return *windows_[size_t(rank)]; }

  // ---- each rank's model at load ----
  using Loader = std::function<ExpertWeights(WeightSource& src, int layer, int expert)>;
  // Rank `rank`'s experts of every MoE layer, by slot of initial_sharding(), and how to load more.
  void attach(int rank, Loader loader, std::vector<std::vector<ExpertWeights>> experts_by_moe);
  // Where a rebalance loads changed slots from (not owned; outlives this object or the next call).
  void set_source(WeightSource* src) { source_ = src; }

  // ---- the thread that steps the group, between steps ----
  // Switches to a prepared placement, if one is ready.
  void before_step();
  // Closes the step's statistics and starts a rebalance when one is due.
  void after_step();
  // Waits for a preparation in flight (its result stays pending for the next before_step): call it
  // before the models whose loaders it uses go away, if they go before this object.
  void join();
  // A rebalance from the window now, prepared and switched to (unless dropped) before returning
  // (tests, benches); its report.
  RebalanceReport rebalance_now();

  const parallel::ExpertPlacement& placement() const { return state_->placement; }
  int64_t steps() const { return steps_; }
  int64_t rebalances() const { return rebalances_; }
  int64_t skipped() const { return skipped_; }  // plans that would not have lowered the imbalance
  int64_t moved_slots_total() const { return moved_total_; }  // over all rebalances
  const RebalanceReport& last_report() const { return last_; }
  // The window summed over the ranks, [moe][expert].
  std::vector<std::vector<double>> window_loads() const;

 private:
  struct State {
    parallel::ExpertPlacement placement;
    std::vector<std::unique_ptr<ExpertSharding>> shardings;        // [moe]
    std::vector<std::vector<std::vector<ExpertWeights>>> experts;  // [rank][moe][slot of the rank]
  };
  struct Prepared {
    std::unique_ptr<State> state;
    RebalanceReport report;
  };
  // Plans from `loads` and loads the changed slots (any thread: reads only the current state,
  // which does not change while a preparation is in flight).
  Prepared prepare(const std::vector<std::vector<double>>& loads, int64_t step) const;
  void apply(Prepared p);
  std::unique_ptr<State> make_state(parallel::ExpertPlacement placement) const;

  std::vector<int> moe_layers_;
  int experts_, ranks_;
  LiveEplbOptions opt_;
  std::unique_ptr<ExpertSharding> initial_;
  std::unique_ptr<State> state_;
  std::vector<std::unique_ptr<parallel::ExpertLoadWindow>> windows_;  // [rank]
  std::vector<Loader> loaders_;                                       // [rank]
  WeightSource* source_ = nullptr;
  int64_t steps_ = 0, rebalances_ = 0, skipped_ = 0, moved_total_ = 0;
  RebalanceReport last_;
  // A background preparation: its thread, and its result once `ready_`.
  std::thread worker_;
  std::atomic<bool> ready_{false};
  std::mutex mu_;
  std::unique_ptr<Prepared> prepared_;
  std::exception_ptr error_;
};

// Per-rank loads of one layer under a placement, each expert's load split evenly over its replicas.
std::vector<double> rank_loads(const parallel::ExpertPlacement& p, int moe, std::span<const double> load);

}  // namespace beluga
