// Whether the engine is serving, judged from its stats as /health and /ready sample them: unhealthy
// when most of the engine's recent steps failed (every request would fail), or when requests wait
// or run but no step has finished for `stall_after` (the loop is stuck or gone). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

#include "engine/engine.h"

namespace beluga::server {

struct HealthVerdict {
  bool ok = true;
  std::string reason;  // why not, for the /health body
};

class EngineHealth {
 public:
  using Clock = std::chrono::steady_clock;
  // `window`: how far back "recent" steps go; at least `min_failed` failed steps that are at least
  // half of the window's steps make the engine unhealthy.
  explicit EngineHealth(std::chrono::seconds stall_after = std::chrono::seconds(60),
                        std::chrono::seconds window = std::chrono::seconds(10), int64_t min_failed = 3);

  // `engine_generation` (EngineHandle::generation): a new value means a new engine, whose history
  // starts here (the old one's failed steps do not count against it).
  HealthVerdict observe(const EngineStats& stats, Clock::time_point now, uint64_t engine_generation = 0);

 private:
  struct Sample {
    Clock::time_point t;
    int64_t steps, failed;
  };
  const std::chrono::seconds stall_after_, window_;
  const int64_t min_failed_;
  std::mutex mu_;
  std::deque<Sample> samples_;  // oldest first; the first one is at least `window` old when possible
  int64_t last_steps_ = -1;
  uint64_t generation_ = 0;
  Clock::time_point last_progress_{};  // last time steps moved, or the engine had no work
};

}  // namespace beluga::server
