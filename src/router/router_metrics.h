// The router's /metrics page (Prometheus text): per replica its requests, requests in flight,
// failures, retries away from it, breaker state and ejections, the prompt tokens routed to it and the
// estimated cached prefix among them (the cache-aware policy's view), streams it broke off; per
// policy the decisions taken; the router's own request counts and the prefix index's size.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "router/policy.h"
#include "router/replica.h"

namespace beluga::router {

// The prefill leg of a disaggregated request: done (KV at the decode engine), failed (the decode
// engine computes the prompt instead), skipped (no prefill engine or KV address; a continuation).
enum class PrefillResult { kOk, kFailed, kSkipped };

class RouterMetrics {
 public:
  void prefill(PrefillResult r, double seconds) {
    prefills_[size_t(r)].fetch_add(1, std::memory_order_relaxed);
    prefill_micros_.fetch_add(uint64_t(seconds * 1e6), std::memory_order_relaxed);
  }
  void decision(Policy p, Decision d) {
    decisions_[size_t(p)][size_t(d)].fetch_add(1, std::memory_order_relaxed);
  }
  void request() { requests_.fetch_add(1, std::memory_order_relaxed); }
  void retry() { retries_.fetch_add(1, std::memory_order_relaxed); }
  void unroutable() { unroutable_.fetch_add(1, std::memory_order_relaxed); }

  std::string render(const std::vector<std::unique_ptr<Replica>>& replicas, size_t index_blocks) const;

 private:
  std::array<std::array<std::atomic<uint64_t>, kNumDecisions>, 3> decisions_{};
  std::atomic<uint64_t> requests_{0}, retries_{0}, unroutable_{0};
  std::array<std::atomic<uint64_t>, 3> prefills_{};
  std::atomic<uint64_t> prefill_micros_{0};
};

}  // namespace beluga::router
