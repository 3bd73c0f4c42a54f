#include "parallel/expert_placement.h"

#include "util/error.h"

namespace beluga::parallel {

ExpertPlacement::ExpertPlacement(const EplbPlan& plan, int num_gpus, int num_nodes) {
  BELUGA_CHECK(!plan.layers.empty(), "expert placement: an empty plan");
  layers_ = int(plan.layers.size());
  experts_ = int(plan.layers[0].replica_count.size());
  slots_ = int(plan.layers[0].phy_to_log.size());
  gpus_ = num_gpus;
  nodes_ = num_nodes;
  BELUGA_CHECK(gpus_ >= 1 && slots_ % gpus_ == 0 && nodes_ >= 1 && gpus_ % nodes_ == 0,
               "expert placement: ", slots_, " slots over ", gpus_, " GPUs on ", nodes_,
               " nodes do not divide");
  phy_to_log_.reserve(size_t(layers_) * size_t(slots_));
  for (const LayerPlan& l : plan.layers) {
    BELUGA_CHECK(int(l.phy_to_log.size()) == slots_, "expert placement: layers with different slot counts");
    phy_to_log_.insert(phy_to_log_.end(), l.phy_to_log.begin(), l.phy_to_log.end());
  }
  index_replicas();
}

ExpertPlacement ExpertPlacement::contiguous(int layers, int experts, int num_gpus, int num_nodes) {
  BELUGA_CHECK(layers >= 1 && num_gpus >= 1 && experts % num_gpus == 0 && num_gpus % num_nodes == 0,
               "expert placement: ", experts, " experts do not divide over ", num_gpus, " GPUs");
  ExpertPlacement p;
  p.layers_ = layers;
  p.experts_ = p.slots_ = experts;
  p.gpus_ = num_gpus;
  p.nodes_ = num_nodes;
  p.phy_to_log_.resize(size_t(layers) * size_t(experts));
  for (size_t i = 0; i < p.phy_to_log_.size(); ++i) p.phy_to_log_[i] = int(i % size_t(experts));
  p.index_replicas();
  return p;
}

void ExpertPlacement::index_replicas() {
  // A counting sort of each layer's slots by expert; slots of one expert stay in slot order.
  replica_begin_.assign(size_t(layers_) * size_t(experts_) + 1, 0);
  for (int l = 0; l < layers_; ++l)
    for (int p = 0; p < slots_; ++p) {
      const int e = logical_of_slot(l, p);
      BELUGA_CHECK(e >= 0 && e < experts_, "expert placement: slot ", p, " holds no valid expert");
      ++replica_begin_[size_t(l) * size_t(experts_) + size_t(e) + 1];
    }
  for (size_t i = 1; i < replica_begin_.size(); ++i) {
    BELUGA_CHECK(replica_begin_[i] > 0, "expert placement: an expert without a replica");
    replica_begin_[i] += replica_begin_[i - 1];
  }
  replica_slots_.assign(phy_to_log_.size(), 0);
  std::vector<int> fill(replica_begin_.begin(), replica_begin_.end() - 1);
  for (int l = 0; l < layers_; ++l)
    for (int p = 0; p < slots_; ++p)
      replica_slots_[size_t(fill[size_t(l) * size_t(experts_) + size_t(logical_of_slot(l, p))]++)] = p;
}

std::span<const int> ExpertPlacement::replicas(int layer, int logical) const {
  const size_t i = size_t(layer) * size_t(experts_) + size_t(logical);
  return {replica_slots_.data() + replica_begin_[i], size_t(replica_begin_[i + 1] - replica_begin_[i])};
}

std::vector<int> ExpertPlacement::experts_on_rank(int layer, int rank) const {
  std::vector<int> out;
  for (int p = rank * slots_per_gpu(); p < (rank + 1) * slots_per_gpu(); ++p)
    out.push_back(logical_of_slot(layer, p));
  return out;
}

namespace {

// splitmix64's finalizer: consecutive keys land on unrelated replicas.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

int ExpertPlacement::choose(int layer, int logical, int source_rank, uint64_t token_key) const {
  const std::span<const int> r = replicas(layer, logical);
  if (r.size() == 1) return r[0];
  int own = 0, local = 0;
  const int node = node_of_rank(source_rank);
  for (int p : r) {
    own += rank_of_slot(p) == source_rank;
    local += node_of_rank(rank_of_slot(p)) == node;
  }
  // The candidates: own rank's replicas, else the node's, else all; the key's hash picks the k-th.
  const int n = own ? own : local ? local : int(r.size());
  int k = int(mix(token_key ^ (uint64_t(layer) << 40) ^ (uint64_t(logical) << 20)) % uint64_t(n));
  for (int p : r) {
    const bool candidate = own     ? rank_of_slot(p) == source_rank
                           : local ? node_of_rank(rank_of_slot(p)) == node
                                   : true;
    if (candidate && k-- == 0) return p;
  }
  BELUGA_ASSERT(false);
  return r[0];
}

int64_t ExpertPlacement::moved_slots(const ExpertPlacement& next) const {
  BELUGA_CHECK(next.layers_ == layers_ && next.slots_ == slots_, "expert placement: shapes differ");
  int64_t moved = 0;
  for (size_t i = 0; i < phy_to_log_.size(); ++i) moved += phy_to_log_[i] != next.phy_to_log_[i];
  return moved;
}

}  // namespace beluga::parallel
