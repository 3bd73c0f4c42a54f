// Which decode engine a disaggregated request goes to, by KV usage and requests in flight (as
// DeepSeek's decode balancer balances both): the prompt's KV arrives with the request, so no cache
// affinity counts, only room and load. One cost per candidate:
//
//   cost(r) = in_flight(r) + decode_kv_requests * kv_usage(r)
//
// kv_usage is the engine's own (its /health: KV blocks referenced by live sequences over all of
// them, 0..1, as of the last health check); in_flight is the router's (live). A full KV costs
// decode_kv_requests requests in flight: there the request would queue or preempt another, while
// an engine with room admits it at once. An engine at or above decode_kv_full is passed over while
// any other is below it. The cheapest wins; ties rotate by the ticket.
#pragma once

#include <cstdint>
#include <span>

#include "router/policy.h"

namespace beluga::router {

// `candidates` is not empty; their kv_usage is set. Returns an index into them.
size_t choose_decode(std::span<const Candidate> candidates, const CostKnobs& knobs, uint64_t ticket);

}  // namespace beluga::router
