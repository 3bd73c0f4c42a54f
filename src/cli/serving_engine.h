// The engine `beluga serve` runs, behind a handle the server keeps for its whole life. With
// expert-parallel thread ranks (--expert-parallel-size N) a rank that fails takes the instance down
// and a restart thread brings it back: the handle answers 503 with the cause (/health, /ready and
// new requests), the engine goes (requests still in it end with an error), the model is rebuilt
// over the ranks left (parallel/healthy_group.h; the failed rank, and on GPUs its device, is not used
// again; the backend, weights, KV tiers and server stay) and a new engine takes over on the same
// port. When no restart is possible (the reload fails; rank 0's GPU failed) the instance stays down
// and the process drains and exits with status 1 (gave_up()), for its supervisor.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "cli/model_args.h"
#include "engine/engine.h"
#include "server/restartable_engine.h"

namespace beluga::cli {

class ServingEngine {
 public:
  // `m` (its model) and `ma` (how it was loaded) must outlive this.
  ServingEngine(LoadedModel& m, const ModelArgs& ma, EngineConfig ecfg);
  ~ServingEngine();  // a restart in progress finishes first; then the engine goes
  ServingEngine(const ServingEngine&) = delete;
  ServingEngine& operator=(const ServingEngine&) = delete;

  server::EngineHandle& handle() { return handle_; }
  int max_model_len() const { return handle_.max_model_len(); }
  // Prometheus text: the expert-parallel ranks serving and the restarts so far.
  std::string metrics(const std::string& model_name) const;
  bool gave_up() const;

 private:
  void watch_failures();  // hands the current peers' failure to the restart thread
  void run();             // the restart thread
  // The instance stays down (503 with `cause` and `why`) and the process ends (status 1).
  void give_up(const std::string& cause, const std::string& why);

  LoadedModel& m_;
  const ModelArgs& ma_;
  const EngineConfig ecfg_;
  std::unique_ptr<Engine> engine_;
  server::RestartableEngine handle_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<RankFailure> failure_;  // the failure to restart from; guarded by mu_
  bool stop_ = false;
  bool gave_up_ = false;
  int ranks_ = 1;
  int restarts_ = 0;
  std::thread thread_;
};

}  // namespace beluga::cli
