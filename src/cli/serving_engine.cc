#include "cli/serving_engine.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "parallel/healthy_group.h"
#include "util/error.h"
#include "util/log.h"

namespace beluga::cli {

ServingEngine::ServingEngine(LoadedModel& m, const ModelArgs& ma, EngineConfig ecfg)
    : m_(m),
      ma_(ma),
      ecfg_(std::move(ecfg)),
      engine_(std::make_unique<Engine>(*m.model, ecfg_)),
      handle_(engine_->max_model_len()),
      ranks_(group_ranks(ma)) {
  handle_.bring_up(engine_.get());
  if (m_.ep_peers) {
    watch_failures();
    thread_ = std::thread([this] { run(); });
  }
}

ServingEngine::~ServingEngine() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (m_.ep_peers) m_.ep_peers->on_failure(nullptr);  // this object goes: nothing to tell
  handle_.take_down("shutting down");
  engine_.reset();
}

void ServingEngine::watch_failures() {
  m_.ep_peers->on_failure([this](const RankFailure& f) {
    {
      std::lock_guard lock(mu_);
      if (!failure_) failure_ = f;
    }
    cv_.notify_all();
  });
}

void ServingEngine::run() {
  for (;;) {
    RankFailure f;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || failure_; });
      if (stop_) return;
      f = *failure_;
    }
    // The ranks left: on GPUs the failed rank's device goes (rank 0 keeps the backend's own).
    std::vector<int> devices = m_.ep_devices;
    if (size_t(f.rank) < devices.size()) devices.erase(devices.begin() + f.rank);
    const int next = ma_.tensor_parallel_size > 1
                         ? tensor_parallel_restart_size(m_.cfg, ranks_ - 1)
                         : healthy_group_size(ranks_ - 1, m_.cfg.n_routed_experts, ma_.eplb.has_value());
    const std::string cause = str(ma_.tensor_parallel_size > 1 ? "tensor" : "expert", "-parallel rank ",
                                  f.rank, " of ", ranks_, " failed (", f.cause, ")");
    if (f.rank == 0 && !m_.ep_devices.empty()) {
      // Rank 0's GPU holds the backend the KV tiers and the sampler were made with: no restart here.
      give_up(cause, "rank 0's GPU cannot be replaced in place; restart the process without it");
      return;
    }
    log::error("serve", cause, "; restarting over ", next, next == 1 ? " rank" : " ranks");
    handle_.take_down(str("restarting: ", cause));
    const auto t0 = std::chrono::steady_clock::now();
    // Every later step of the failed group fails at once, naming the rank: let the old engine fail
    // the requests it holds with that error (bounded) rather than end them as aborted.
    for (int i = 0; i < 1000; ++i) {
      const EngineStats st = engine_->stats();
      if (st.running + st.waiting == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    engine_.reset();  // what is left ends as aborted (its clients get an error too)
    try {
      if (!devices.empty()) devices.erase(devices.begin());  // rank 0's stays with the backend
      reload_expert_parallel(m_, ma_, next, devices);
      engine_ = std::make_unique<Engine>(*m_.model, ecfg_);
    } catch (const std::exception& e) {
      give_up(cause, str("the restart failed: ", e.what()));
      return;
    }
    {
      std::lock_guard lock(mu_);
      failure_.reset();
      ranks_ = next;
      ++restarts_;
    }
    if (m_.ep_peers) watch_failures();
    handle_.bring_up(engine_.get());
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f",
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    log::info("serve", "serving again over ", next, ma_.tensor_parallel_size > 1 ? " tensor" : " expert",
              next == 1 ? "-parallel rank" : "-parallel ranks", " (restart ", restarts_, ", ", secs, " s)");
    if (!m_.ep_peers) return;  // one rank: nothing left to fail over
  }
}

void ServingEngine::give_up(const std::string& cause, const std::string& why) {
  log::error("serve", cause, "; ", why, ": the instance stays down and exits");
  {
    std::lock_guard lock(mu_);
    gave_up_ = true;
  }
  handle_.take_down(str("down: ", cause, "; ", why));
  kill(getpid(), SIGTERM);  // serve's signal wait: drain and exit (status 1)
}

std::string ServingEngine::metrics(const std::string& model_name) const {
  int ranks = 0, restarts = 0;
  {
    std::lock_guard lock(mu_);
    ranks = ranks_;
    restarts = restarts_;
  }
  const std::string label = "{model_name=\"" + model_name + "\"}";
  return "# HELP beluga_expert_parallel_ranks Thread ranks the model runs over (expert, data or tensor "
         "parallel).\n"
         "# TYPE beluga_expert_parallel_ranks gauge\nbeluga_expert_parallel_ranks" +
         label + " " + std::to_string(ranks) +
         "\n# HELP beluga_engine_restarts_total Restarts of the engine after a thread rank "
         "failed.\n"
         "# TYPE beluga_engine_restarts_total counter\nbeluga_engine_restarts_total" +
         label + " " + std::to_string(restarts) + "\n";
}

bool ServingEngine::gave_up() const {
  std::lock_guard lock(mu_);
  return gave_up_;
}

}  // namespace beluga::cli
