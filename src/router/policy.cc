#include "router/policy.h"

#include <algorithm>
#include <limits>

namespace beluga::router {

std::optional<Policy> parse_policy(std::string_view name) {
  if (name == "cache-aware") return Policy::kCacheAware;
  if (name == "round-robin") return Policy::kRoundRobin;
  if (name == "least-load") return Policy::kLeastLoad;
  return std::nullopt;
}

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::kCacheAware:
      return "cache-aware";
    case Policy::kRoundRobin:
      return "round-robin";
    case Policy::kLeastLoad:
      return "least-load";
  }
  return "?";
}

const char* decision_name(Decision d) {
  switch (d) {
    case Decision::kAffinity:
      return "affinity";
    case Decision::kSpill:
      return "spill";
    case Decision::kLeastLoad:
      return "least_load";
    case Decision::kRoundRobin:
      return "round_robin";
  }
  return "?";
}

Choice choose(Policy policy, std::span<const Candidate> c, int prompt_tokens, const CostKnobs& knobs,
              uint64_t ticket) {
  const size_t n = c.size();
  const size_t start = size_t(ticket % n);
  if (policy == Policy::kRoundRobin) return Choice{start, Decision::kRoundRobin, 0};

  int min_load = std::numeric_limits<int>::max();
  for (const auto& x : c) min_load = std::min(min_load, x.in_flight);
  const bool cache = policy == Policy::kCacheAware;
  Choice best;
  best.cost = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < n; ++k) {  // from `start`, so that ties rotate
    const size_t i = (start + k) % n;
    if (cache && c[i].in_flight > min_load + knobs.balance_window) continue;
    double cost = knobs.load_cost_tokens * c[i].in_flight;
    if (cache)
      cost += std::max(0, prompt_tokens - knobs.block_size * c[i].matched_blocks) +
              knobs.block_size *
                  (knobs.host_block_cost * c[i].host_blocks + knobs.disk_block_cost * c[i].disk_blocks);
    if (!cache) cost = c[i].in_flight;  // least-load: the count alone
    if (cost < best.cost) {
      best.cost = cost;
      best.index = i;
    }
  }
  if (!cache) {
    best.decision = Decision::kLeastLoad;
    return best;
  }
  int most = 0;
  for (const auto& x : c) most = std::max(most, x.matched_blocks);
  const int got = c[best.index].matched_blocks;
  best.decision = most == 0 ? Decision::kLeastLoad : got == most ? Decision::kAffinity : Decision::kSpill;
  return best;
}

}  // namespace beluga::router
