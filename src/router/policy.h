// Which replica a request goes to. One cost per candidate replica r, in prompt tokens:
//
//   cost(r) = uncached(r) + tier(r) + load_cost_tokens * in_flight(r)
//   uncached(r) = prompt_tokens - block_size * matched_blocks(r)
//   tier(r) = block_size * (host_block_cost * host_blocks(r) + disk_block_cost * disk_blocks(r))
//
// where a matched block on the device costs nothing, one whose fastest copy is in host memory or in
// a file costs that fraction of recomputing it (loading it is not free; the tiers are known from
// the replicas' block events, router/kv_index.h),
// over the replicas whose in_flight is within `balance_window` of the least-loaded one's; the
// cheapest wins, ties rotate. So a replica holding the prompt's prefix keeps its affinity until it
// runs `balance_window` requests more than the idlest replica, then the prefix spills to others
// (which then hold it too). round-robin rotates; least-load takes the fewest in flight (ties rotate).
// The cache-aware policy without any match is least-load. Decisions are labelled for /metrics.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "model/batch.h"

namespace beluga::router {

enum class Policy { kCacheAware, kRoundRobin, kLeastLoad };
std::optional<Policy> parse_policy(std::string_view name);  // cache-aware, round-robin, least-load
const char* policy_name(Policy p);

struct CostKnobs {
  int balance_window = 8;         // in-flight requests above the least-loaded that affinity tolerates
  double load_cost_tokens = 128;  // what one request in flight costs, in uncached prompt tokens
  int block_size = kKvBlockSize;  // tokens per prefix-cache block (the engine's)
  // What loading one cached block from a lower tier costs, as a fraction of recomputing it.
  double host_block_cost = 0.1;
  double disk_block_cost = 0.4;
  // Decode engines (decode_balance.h): what a full KV costs, in requests in flight, and the usage
  // at which an engine is passed over while another has room.
  double decode_kv_requests = 16;
  double decode_kv_full = 0.95;
};

struct Candidate {
  int replica = 0;  // its id (opaque to the policy)
  int in_flight = 0;
  int matched_blocks = 0;  // leading prompt blocks the prefix index says it holds
  int host_blocks = 0;     // of those, held only below the device: in host memory
  int disk_blocks = 0;     // ... in files
  double kv_usage = 0;     // its KV blocks in use, 0..1 (a decode engine's /health)
};

// affinity: the chosen replica holds part of the prefix; spill: a replica holding more was passed
// over for load; least_load: nobody holds any of it; round_robin: the round-robin policy.
enum class Decision { kAffinity = 0, kSpill = 1, kLeastLoad = 2, kRoundRobin = 3 };
inline constexpr int kNumDecisions = 4;
const char* decision_name(Decision d);

struct Choice {
  size_t index = 0;  // into the candidates
  Decision decision = Decision::kLeastLoad;
  double cost = 0;
};

// `candidates` is not empty; `ticket` is a counter that grows by one per request (the rotation).
Choice choose(Policy policy, std::span<const Candidate> candidates, int prompt_tokens, const CostKnobs& knobs,
              uint64_t ticket);

}  // namespace beluga::router
