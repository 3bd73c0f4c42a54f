#include "router/circuit_breaker.h"

#include <algorithm>

namespace beluga::router {

const char* breaker_state_name(BreakerState s) {
  switch (s) {
    case BreakerState::kClosed:
      return "closed";
    case BreakerState::kOpen:
      return "open";
    case BreakerState::kHalfOpen:
      return "half_open";
  }
  return "?";
}

CircuitBreaker::CircuitBreaker(int eject_after) : eject_after_(std::max(1, eject_after)) {}

bool CircuitBreaker::on_failure() {
  std::lock_guard lock(mu_);
  ++consecutive_failures_;
  const BreakerState s = state_.load();
  if (s == BreakerState::kOpen) return false;
  if (s == BreakerState::kHalfOpen || consecutive_failures_ >= eject_after_) {
    state_.store(BreakerState::kOpen, std::memory_order_release);
    ejections_.fetch_add(1, std::memory_order_relaxed);
    return true;
  }
  return false;
}

bool CircuitBreaker::on_success() {
  std::lock_guard lock(mu_);
  consecutive_failures_ = 0;
  switch (state_.load()) {
    case BreakerState::kOpen:
      state_.store(BreakerState::kHalfOpen, std::memory_order_release);
      return true;
    case BreakerState::kHalfOpen:
      state_.store(BreakerState::kClosed, std::memory_order_release);
      return false;
    case BreakerState::kClosed:
      return false;
  }
  return false;
}

}  // namespace beluga::router
