// Where an EPLB plan's physical expert slots live and which replica serves a token, plus the schedule
// that says when to rebalance. Slot p of a layer lives on rank p / slots_per_gpu; rank r is on node
// r / (gpus / nodes). choose() is the dispatch side's replica pick: the token's key (its index in the
// step's batch, say) picks one of the expert's replicas by a hash, so an expert's tokens split evenly
// over its replicas, as EPLB's plan assumes, and the same token always goes to the same slot
// (deterministic, no state, no allocation). It has no preference for a replica on the token's own
// node: with replicas in several nodes (the global policy) that breaks the even split (a 4-layer
// `bench eplb` at EP64, global, 4 redundant per GPU: held-out max/mean 1.36-1.61 with a node
// preference against the plan's 1.004; bench/NOTES.md run 160 measures 1.09 without).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "parallel/eplb.h"

namespace beluga::parallel {

class ExpertPlacement {
 public:
  ExpertPlacement(const EplbPlan& plan, int num_gpus, int num_nodes);
  // No redundancy, expert e on rank e / (experts / gpus): the placement before any statistics.
  static ExpertPlacement contiguous(int layers, int experts, int num_gpus, int num_nodes);

  int layers() const { return layers_; }
  int experts() const { return experts_; }
  int slots() const { return slots_; }  // physical slots per layer
  int slots_per_gpu() const { return slots_ / gpus_; }
  int num_gpus() const { return gpus_; }
  int rank_of_slot(int slot) const { return slot / (slots_ / gpus_); }
  int node_of_rank(int rank) const { return rank / (gpus_ / nodes_); }
  int logical_of_slot(int layer, int slot) const {
    return phy_to_log_[size_t(layer) * size_t(slots_) + size_t(slot)];
  }
  std::span<const int> replicas(int layer, int logical) const;
  // The logical experts rank `rank` holds in `layer`, by slot (what it loads and computes).
  std::vector<int> experts_on_rank(int layer, int rank) const;

  // The slot that serves a token routed to `logical` in `layer` (see the header).
  int choose(int layer, int logical, uint64_t token_key) const;

  // Slots (over all layers) whose expert differs in `next`: the expert weights a rebalance copies.
  int64_t moved_slots(const ExpertPlacement& next) const;
  // The same placement up to which GPU holds which of its GPUs' contents and the slot order within a
  // GPU (neither changes any GPU's load), arranged to keep as many of `previous`'s slots as it can:
  // GPUs are matched to previous GPUs by the most experts in common (greedily; within a node when
  // `within_nodes`, which keeps a hierarchical plan's groups on their nodes), then an expert a matched
  // GPU already held keeps its slot. A rebalance then copies only the experts that really move.
  ExpertPlacement aligned_to(const ExpertPlacement& previous, bool within_nodes) const;

 private:
  ExpertPlacement() = default;
  void index_replicas();

  int layers_ = 0, experts_ = 0, slots_ = 0, gpus_ = 1, nodes_ = 1;
  std::vector<int> phy_to_log_;     // layers x slots
  std::vector<int> replica_begin_;  // layers x experts + 1: offsets into replica_slots_
  std::vector<int> replica_slots_;  // each expert's slots, by replica, layer after layer
};

// When to rebalance and with how many redundant experts: DeepInfer's knobs (issue #27).
struct RebalanceSchedule {
  int redundant_per_gpu = 0;  // extra slots per GPU beyond experts / gpus
  int window_steps = 0;       // the statistics window (ExpertLoadWindow)
  int interval_steps = 0;     // rebalance every this many steps

  static RebalanceSchedule prefill() { return {4, 100, 1000}; }
  static RebalanceSchedule decode() { return {1, 1000, 10000}; }

  // Physical slots per layer for this schedule (EplbShape::num_replicas).
  int num_replicas(int experts, int num_gpus) const { return experts + redundant_per_gpu * num_gpus; }
  // Step `step` (counted from 1) ends with a rebalance.
  bool due(int64_t step) const { return interval_steps > 0 && step > 0 && step % interval_steps == 0; }
};

}  // namespace beluga::parallel
