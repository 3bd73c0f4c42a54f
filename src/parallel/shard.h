// Expert sharding: which rank holds which experts. The group holds P physical expert slots, rank r
// the contiguous run slot_begin(r) .. slot_end(r) (P / ranks each, the first P % ranks ranks one
// more); slot p holds logical expert physical_to_logical[p] (the router's id). With P == E and the
// identity map (contiguous()) every expert lives once; a placement such as EPLB's may map several
// slots to one logical expert (redundant replicas) and reorder them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace beluga {

class ExpertSharding {
 public:
  // Which replica of an expert serves a token (route()): one on the token's own rank when there is
  // one (no transfer), or always the token's share of an even split over the replicas, which is
  // what EPLB's plans assume (live EPLB: with the local preference, 2 ranks with 2 redundant slots
  // each measured max/mean 1.074 where the plan estimated 1.000; `beluga bench ep`).
  enum class ReplicaChoice { kPreferLocal, kEven };
  // Every logical expert in [0, num_logical) must have at least one slot.
  ExpertSharding(int num_logical, int ranks, std::vector<int> physical_to_logical,
                 ReplicaChoice choice = ReplicaChoice::kPreferLocal);
  // E experts, identity map: rank r holds experts [r E / ranks, ...) contiguously.
  static ExpertSharding contiguous(int num_experts, int ranks);

  int ranks() const { return ranks_; }
  int num_logical() const { return num_logical_; }
  int num_physical() const { return int(p2l_.size()); }
  int slot_begin(int rank) const;
  int slot_end(int rank) const;
  int owner(int physical) const;  // the rank holding slot `physical`
  int logical(int physical) const { return p2l_[size_t(physical)]; }
  // The logical experts of rank's slots, in slot order (what that rank loads).
  std::vector<int> local_experts(int rank) const;
  const std::vector<int>& replicas(int logical) const { return replicas_[size_t(logical)]; }
  // The slot that serves logical expert `e` for the token numbered `token` of rank `from`: with
  // kPreferLocal a replica on `from` itself when there is one (no transfer), else (and always with
  // kEven) replica token % count (spreads a hot expert's tokens over its replicas, deterministically).
  int route(int e, int64_t token, int from) const;

 private:
  int num_logical_, ranks_;
  ReplicaChoice choice_;
  std::vector<int> p2l_;
  std::vector<std::vector<int>> replicas_;  // logical -> its slots, ascending
};

// The routed expert a checkpoint tensor belongs to: "<prefix>.experts.<e>.<rest>" (DeepSeek
// V2/V3 "mlp.experts.", V4 "ffn.experts."); none for every other tensor (shared experts too).
struct ExpertTensorName {
  int layer = -1;  // from "layers.<l>." when present
  int expert = -1;
};
std::optional<ExpertTensorName> parse_expert_tensor(const std::string& name);

// Whether `rank` needs checkpoint tensor `name`: everything but the routed experts it does not hold.
bool rank_needs_tensor(const ExpertSharding& s, int rank, const std::string& name);

}  // namespace beluga
