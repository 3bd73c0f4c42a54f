#include "server/restartable_engine.h"

#include <algorithm>
#include <mutex>

namespace beluga::server {

EngineStats add_engine_counters(const EngineStats& base, const EngineStats& now) {
  EngineStats s = now;
  for (int64_t EngineStats::*counter :
       {&EngineStats::requests_finished, &EngineStats::prompt_tokens, &EngineStats::generation_tokens,
        &EngineStats::prefix_cache_queries, &EngineStats::prefix_cache_hits,
        &EngineStats::prefix_cache_hits_below, &EngineStats::preemptions, &EngineStats::steps,
        &EngineStats::steps_failed, &EngineStats::steps_early, &EngineStats::steps_early_retried,
        &EngineStats::steps_host_sampled, &EngineStats::spec_drafts, &EngineStats::spec_draft_tokens,
        &EngineStats::spec_accepted_tokens})
    s.*counter += base.*counter;
  s.last_step_unix_ms = std::max(s.last_step_unix_ms, base.last_step_unix_ms);
  if (s.spec_accepted_per_position.size() < base.spec_accepted_per_position.size())
    s.spec_accepted_per_position.resize(base.spec_accepted_per_position.size(), 0);
  for (size_t k = 0; k < base.spec_accepted_per_position.size(); ++k)
    s.spec_accepted_per_position[k] += base.spec_accepted_per_position[k];
  return s;
}

void RestartableEngine::bring_up(Engine* e) {
  std::unique_lock lock(mu_);
  engine_ = e;
  reason_.clear();
  ++generation_;
}

void RestartableEngine::take_down(std::string reason) {
  std::unique_lock lock(mu_);  // waits for the calls in the engine
  if (engine_) {
    EngineStats gone = add_engine_counters(retired_, engine_->stats());
    gone.running = gone.waiting = gone.kv_blocks_used = 0;
    gone.kv_blocks_used_by_rank.clear();
    retired_ = gone;
  }
  engine_ = nullptr;
  reason_ = std::move(reason);
}

SubmitStatus RestartableEngine::submit(EngineRequest req, std::string* why) {
  std::shared_lock lock(mu_);
  if (!engine_) {
    if (why) *why = reason_;
    return SubmitStatus::kUnavailable;
  }
  return engine_->submit(std::move(req), why);
}

void RestartableEngine::abort(const std::string& request_id) {
  std::shared_lock lock(mu_);
  if (engine_) engine_->abort(request_id);
}

EngineStats RestartableEngine::stats() const {
  std::shared_lock lock(mu_);
  return engine_ ? add_engine_counters(retired_, engine_->stats()) : retired_;
}

std::optional<std::string> RestartableEngine::unavailable() const {
  std::shared_lock lock(mu_);
  if (engine_) return std::nullopt;
  return reason_;
}

uint64_t RestartableEngine::generation() const {
  std::shared_lock lock(mu_);
  return generation_;
}

}  // namespace beluga::server
