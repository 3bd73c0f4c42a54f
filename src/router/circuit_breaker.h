// A replica's circuit breaker. Closed: the replica takes traffic; `eject_after` consecutive failures
// (requests that got no response from it, failed health checks) open it. Open: no traffic until a
// health probe succeeds, which half-opens it. Half-open: traffic flows again; the next success closes
// it, the next failure opens it again. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

namespace beluga::router {

enum class BreakerState { kClosed = 0, kOpen = 1, kHalfOpen = 2 };
const char* breaker_state_name(BreakerState s);  // "closed", "open", "half_open"

class CircuitBreaker {
 public:
  explicit CircuitBreaker(int eject_after);

  BreakerState state() const { return state_.load(std::memory_order_acquire); }
  bool allows_traffic() const { return state() != BreakerState::kOpen; }
  // True when this failure opened the breaker (the replica was just ejected).
  bool on_failure();
  // A request or probe succeeded. True when this closed or half-opened an open breaker.
  bool on_success();
  uint64_t ejections() const { return ejections_.load(std::memory_order_relaxed); }

 private:
  const int eject_after_;
  std::mutex mu_;
  int consecutive_failures_ = 0;
  std::atomic<BreakerState> state_{BreakerState::kClosed};
  std::atomic<uint64_t> ejections_{0};
};

}  // namespace beluga::router
