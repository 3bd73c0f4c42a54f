#include "server/engine_health.h"

namespace beluga::server {

EngineHealth::EngineHealth(std::chrono::seconds stall_after, std::chrono::seconds window, int64_t min_failed)
    : stall_after_(stall_after), window_(window), min_failed_(min_failed) {}

HealthVerdict EngineHealth::observe(const EngineStats& s, Clock::time_point now, uint64_t engine_generation) {
  std::lock_guard lock(mu_);
  if (engine_generation != generation_) {
    generation_ = engine_generation;
    samples_.clear();
    last_steps_ = -1;
  }
  // Stall: work is pending and the step counter has not moved for stall_after.
  const int pending = s.running + s.waiting;
  if (s.steps != last_steps_ || pending == 0 || last_steps_ < 0) last_progress_ = now;
  last_steps_ = s.steps;

  samples_.push_back({now, s.steps, s.steps_failed});
  // Keep one sample at least `window` old as the baseline, drop the older ones.
  while (samples_.size() > 2 && samples_[1].t <= now - window_) samples_.pop_front();
  const Sample& base = samples_.front();
  const int64_t steps = s.steps - base.steps, failed = s.steps_failed - base.failed;

  HealthVerdict v;
  if (failed >= min_failed_ && failed * 2 >= steps) {
    v.ok = false;
    v.reason = std::to_string(failed) + " of the engine's last " + std::to_string(steps) + " steps failed";
  } else if (now - last_progress_ >= stall_after_) {
    v.ok = false;
    v.reason =
        "no engine step finished in " +
        std::to_string(std::chrono::duration_cast<std::chrono::seconds>(now - last_progress_).count()) +
        " s while " + std::to_string(pending) + " requests wait or run";
  }
  return v;
}

}  // namespace beluga::server
