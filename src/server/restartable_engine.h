// An EngineHandle whose engine may be replaced while the server runs (an expert-parallel instance
// restarting after a rank failed, cli/serving_engine.h). Between take_down() and bring_up() new
// requests get kUnavailable with the reason (a 503) and /health says it; aborts go nowhere (the old
// engine ends its requests itself). Counters continue across engines (the stats add the ones of the
// engines taken down), so /metrics stays monotonic; generation() changes with each engine.
#pragma once

#include <cstdint>
#include <optional>
#include <shared_mutex>
#include <string>

#include "server/engine_handle.h"

namespace beluga::server {

class RestartableEngine final : public EngineHandle {
 public:
  explicit RestartableEngine(int max_model_len) : max_model_len_(max_model_len) {}

  // From here on calls go to `e` (it must stay until take_down() returns).
  void bring_up(Engine* e);
  // From here on no call reaches the engine: returns once the calls in it have returned, with its
  // counters kept. The engine may then be destroyed.
  void take_down(std::string reason);

  SubmitStatus submit(EngineRequest req, std::string* why) override;
  void abort(const std::string& request_id) override;
  EngineStats stats() const override;
  int max_model_len() const override { return max_model_len_; }
  std::optional<std::string> unavailable() const override;
  uint64_t generation() const override;

 private:
  const int max_model_len_;
  mutable std::shared_mutex mu_;
  Engine* engine_ = nullptr;
  std::string reason_ = "loading";
  EngineStats retired_;  // the counters of the engines taken down
  uint64_t generation_ = 0;
};

// `base`'s counters plus `now`'s, with `now`'s gauges (running, waiting, blocks, last step).
EngineStats add_engine_counters(const EngineStats& base, const EngineStats& now);

}  // namespace beluga::server
