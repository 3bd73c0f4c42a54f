#include "parallel/expert_placement.h"

#include <algorithm>
#include <tuple>

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

int ExpertPlacement::choose(int layer, int logical, uint64_t token_key) const {
  const std::span<const int> r = replicas(layer, logical);
  if (r.size() == 1) return r[0];
  return r[size_t(mix(token_key ^ (uint64_t(layer) << 40) ^ (uint64_t(logical) << 20)) % r.size())];
}

int64_t ExpertPlacement::moved_slots(const ExpertPlacement& next) const {
  BELUGA_CHECK(next.layers_ == layers_ && next.slots_ == slots_, "expert placement: shapes differ");
  int64_t moved = 0;
  for (size_t i = 0; i < phy_to_log_.size(); ++i) moved += phy_to_log_[i] != next.phy_to_log_[i];
  return moved;
}

ExpertPlacement ExpertPlacement::aligned_to(const ExpertPlacement& previous, bool within_nodes) const {
  BELUGA_CHECK(previous.layers_ == layers_ && previous.slots_ == slots_ && previous.gpus_ == gpus_ &&
                   previous.nodes_ == nodes_ && previous.experts_ == experts_,
               "expert placement: shapes differ");
  ExpertPlacement out = *this;
  const int per = slots_per_gpu();
  std::vector<std::tuple<int, int, int>> pairs;  // (-common experts, previous GPU, this GPU)
  std::vector<int> count(static_cast<size_t>(experts_), 0), target(static_cast<size_t>(gpus_), -1);
  std::vector<char> taken(static_cast<size_t>(gpus_));
  for (int l = 0; l < layers_; ++l) {
    const int* mine = phy_to_log_.data() + size_t(l) * size_t(slots_);
    const int* old = previous.phy_to_log_.data() + size_t(l) * size_t(slots_);
    pairs.clear();
    for (int i = 0; i < gpus_; ++i)
      for (int j = 0; j < gpus_; ++j) {
        if (within_nodes && node_of_rank(i) != node_of_rank(j)) continue;
        for (int k = 0; k < per; ++k) ++count[size_t(mine[j * per + k])];
        int common = 0;
        for (int k = 0; k < per; ++k) {
          int& c = count[size_t(old[i * per + k])];
          if (c > 0) --c, ++common;
        }
        for (int k = 0; k < per; ++k) count[size_t(mine[j * per + k])] = 0;
        pairs.emplace_back(-common, i, j);
      }
    std::sort(pairs.begin(), pairs.end());
    std::fill(target.begin(), target.end(), -1);  // previous GPU -> this placement's GPU it takes
    std::fill(taken.begin(), taken.end(), 0);
    for (const auto& [neg, i, j] : pairs)
      if (target[size_t(i)] < 0 && !taken[size_t(j)]) target[size_t(i)] = j, taken[size_t(j)] = 1;
    int* dst = out.phy_to_log_.data() + size_t(l) * size_t(slots_);
    for (int i = 0; i < gpus_; ++i) {
      const int j = target[size_t(i)];
      BELUGA_ASSERT(j >= 0);
      for (int k = 0; k < per; ++k) ++count[size_t(mine[j * per + k])];
      std::vector<char> kept(static_cast<size_t>(per), 0);
      for (int k = 0; k < per; ++k) {  // experts it held keep their slots
        int& c = count[size_t(old[i * per + k])];
        if (c > 0) --c, kept[size_t(k)] = 1, dst[i * per + k] = old[i * per + k];
      }
      int k = 0;
      for (int m = 0; m < per; ++m) {  // the rest fill the other slots, in this placement's order
        const int e = mine[j * per + m];
        if (count[size_t(e)] == 0) continue;
        --count[size_t(e)];
        while (kept[size_t(k)]) ++k;
        dst[i * per + k++] = e;
      }
    }
  }
  out.index_replicas();
  return out;
}

}  // namespace beluga::parallel
