// Server metrics in the Prometheus text format: request counts by API and status, token counts,
// TTFT / TPOT / end-to-end latency histograms, client disconnects, plus the engine's gauges (KV
// blocks, prefix-cache hit rate, running and waiting requests). Thread-safe.
// Where Beluga measures the same quantity as vLLM, the page also carries it under vLLM's name
// (`vllm:num_requests_running`, `vllm:time_to_first_token_seconds`, ...; labelled model_name), so
// dashboards and alerts written for vLLM work unchanged (docs/grafana-dashboard.json).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace beluga::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends `name_bucket{le=…}`, `name_sum`, `name_count` lines; `labels` (`k="v",…`, or empty)
  // go on every line.
  void render(const std::string& name, std::string& out, const std::string& labels = "") const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void request_done(const std::string& api, int status);
  void tokens(int64_t prompt, int64_t cached, int64_t completion);
  void latency(double ttft_s, double tpot_s, double e2e_s, bool has_ttft, bool has_tpot);
  void disconnect();
  void stop_abort();
  void in_flight(int delta);
  void connections(int delta);  // open connections
  void building(int delta);     // requests on the build pool (queued or being built)
  void build_rejected();        // refused because the build queue was full
  void connection_rejected();   // one past max_connections, answered 503

  std::string render(const EngineStats* stats, const std::string& model) const;

 private:
  // The vLLM-named samples; called with mu_ held.
  void render_vllm(const EngineStats* stats, const std::string& model, std::string& out) const;

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  int64_t prompt_tokens_ = 0, cached_tokens_ = 0, completion_tokens_ = 0;
  uint64_t disconnects_ = 0, stop_aborts_ = 0;
  int in_flight_ = 0;
  int connections_ = 0, building_ = 0;
  uint64_t builds_rejected_ = 0;
  uint64_t connections_rejected_ = 0;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace beluga::server
