#include "server/metrics.h"

#include <cstdio>

namespace beluga::server {

namespace {

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

void metric(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

// One sample with its HELP and TYPE lines; `labels` is `{k="v",...}` or empty.
void sample(std::string& out, const std::string& name, const char* type, const char* help,
            const std::string& labels, double v) {
  metric(out, name, type, help);
  out += name + labels + " " + num(v) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out, const std::string& labels) const {
  const std::string first = labels.empty() ? "{" : "{" + labels + ",";
  const std::string only = labels.empty() ? "" : "{" + labels + "}";
  uint64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += name + "_bucket" + first + "le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cum) + "\n";
  }
  cum += counts_.back();
  out += name + "_bucket" + first + "le=\"+Inf\"} " + std::to_string(cum) + "\n";
  out += name + "_sum" + only + " " + num(sum_) + "\n";
  out += name + "_count" + only + " " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_(
          {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5,
             10}),
      e2e_({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240}) {}

void Metrics::request_done(const std::string& api, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{api, status}];
}

void Metrics::tokens(int64_t prompt, int64_t cached, int64_t completion) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += prompt;
  cached_tokens_ += cached;
  completion_tokens_ += completion;
}

void Metrics::latency(double ttft_s, double tpot_s, double e2e_s, bool has_ttft, bool has_tpot) {
  std::lock_guard lock(mu_);
  if (has_ttft) ttft_.observe(ttft_s);
  if (has_tpot) tpot_.observe(tpot_s);
  e2e_.observe(e2e_s);
}

void Metrics::disconnect() {
  std::lock_guard lock(mu_);
  ++disconnects_;
}

void Metrics::stop_abort() {
  std::lock_guard lock(mu_);
  ++stop_aborts_;
}

void Metrics::in_flight(int delta) {
  std::lock_guard lock(mu_);
  in_flight_ += delta;
}

void Metrics::connections(int delta) {
  std::lock_guard lock(mu_);
  connections_ += delta;
}

void Metrics::building(int delta) {
  std::lock_guard lock(mu_);
  building_ += delta;
}

void Metrics::build_rejected() {
  std::lock_guard lock(mu_);
  ++builds_rejected_;
}

void Metrics::connection_rejected() {
  std::lock_guard lock(mu_);
  ++connections_rejected_;
}

std::string Metrics::render(const EngineStats* st, const std::string& model) const {
  std::lock_guard lock(mu_);
  std::string out;
  const std::string lbl = "{model_name=\"" + model + "\"}";
  metric(out, "beluga_requests_total", "counter", "HTTP requests answered, by API and status.");
  for (const auto& [k, v] : requests_)
    out += "beluga_requests_total{api=\"" + k.first + "\",status=\"" + std::to_string(k.second) + "\"} " +
           std::to_string(v) + "\n";
  metric(out, "beluga_requests_in_flight", "gauge", "Generation requests being served.");
  out += "beluga_requests_in_flight" + lbl + " " + std::to_string(in_flight_) + "\n";
  metric(out, "beluga_connections_open", "gauge", "Open HTTP connections.");
  out += "beluga_connections_open" + lbl + " " + std::to_string(connections_) + "\n";
  metric(out, "beluga_connections_rejected_total", "counter",
         "Connections answered 503 because max_connections were open.");
  out += "beluga_connections_rejected_total" + lbl + " " + std::to_string(connections_rejected_) + "\n";
  metric(out, "beluga_requests_building", "gauge",
         "Requests being parsed, templated and tokenized (or waiting for a build thread).");
  out += "beluga_requests_building" + lbl + " " + std::to_string(building_) + "\n";
  metric(out, "beluga_builds_rejected_total", "counter",
         "Requests answered 503 because the build queue was full.");
  out += "beluga_builds_rejected_total" + lbl + " " + std::to_string(builds_rejected_) + "\n";
  metric(out, "beluga_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  out += "beluga_prompt_tokens_total" + lbl + " " + std::to_string(prompt_tokens_) + "\n";
  metric(out, "beluga_prompt_cached_tokens_total", "counter", "Prompt tokens served from the prefix cache.");
  out += "beluga_prompt_cached_tokens_total" + lbl + " " + std::to_string(cached_tokens_) + "\n";
  metric(out, "beluga_generation_tokens_total", "counter", "Generated tokens of finished requests.");
  out += "beluga_generation_tokens_total" + lbl + " " + std::to_string(completion_tokens_) + "\n";
  metric(out, "beluga_client_disconnects_total", "counter",
         "Requests cancelled because the client went away.");
  out += "beluga_client_disconnects_total" + lbl + " " + std::to_string(disconnects_) + "\n";
  metric(out, "beluga_stop_string_aborts_total", "counter",
         "Requests stopped early by a stop string or a closed tool-call block.");
  out += "beluga_stop_string_aborts_total" + lbl + " " + std::to_string(stop_aborts_) + "\n";
  metric(out, "beluga_time_to_first_token_seconds", "histogram", "Time to first token.");
  ttft_.render("beluga_time_to_first_token_seconds", out);
  metric(out, "beluga_time_per_output_token_seconds", "histogram",
         "Mean time per output token after the first, per request.");
  tpot_.render("beluga_time_per_output_token_seconds", out);
  metric(out, "beluga_e2e_request_latency_seconds", "histogram", "End-to-end request latency.");
  e2e_.render("beluga_e2e_request_latency_seconds", out);
  if (st) {
    auto gauge = [&](const char* name, const char* type, const char* help, double v) {
      sample(out, name, type, help, lbl, v);
    };
    // The model's label plus key="i".
    auto label_with = [&](const char* key, size_t i) {
      std::string l = lbl.empty() ? "{" : lbl.substr(0, lbl.size() - 1) + ",";
      return l + key + "=\"" + std::to_string(i) + "\"}";
    };
    gauge("beluga_num_requests_running", "gauge", "Requests in the engine's running batch.", st->running);
    gauge("beluga_num_requests_waiting", "gauge", "Requests waiting in the engine queue.", st->waiting);
    gauge("beluga_kv_blocks_total", "gauge", "KV cache blocks.", st->kv_blocks_total);
    gauge("beluga_kv_blocks_used", "gauge", "KV cache blocks referenced by live sequences.",
          st->kv_blocks_used);
    gauge("beluga_kv_cache_usage_perc", "gauge", "Fraction of KV cache blocks in use.",
          st->kv_blocks_total > 0 ? double(st->kv_blocks_used) / st->kv_blocks_total : 0.0);
    if (!st->kv_blocks_used_by_rank.empty()) {  // attention data parallel: each rank's own cache
      metric(out, "beluga_kv_blocks_used_by_rank", "gauge",
             "KV cache blocks referenced by live sequences, in each data-parallel rank's cache.");
      for (size_t r = 0; r < st->kv_blocks_used_by_rank.size(); ++r)
        out += "beluga_kv_blocks_used_by_rank" + label_with("rank", r) + " " +
               std::to_string(st->kv_blocks_used_by_rank[r]) + "\n";
    }
    gauge("beluga_prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
          double(st->prefix_cache_queries));
    gauge("beluga_prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.",
          double(st->prefix_cache_hits));
    gauge("beluga_prefix_cache_hit_rate", "gauge", "Prefix cache hits / queries since start.",
          st->prefix_cache_queries > 0 ? double(st->prefix_cache_hits) / double(st->prefix_cache_queries)
                                       : 0.0);
    gauge("beluga_engine_requests_finished_total", "counter", "Requests the engine finished.",
          double(st->requests_finished));
    gauge("beluga_engine_prompt_tokens_total", "counter", "Prompt tokens the engine processed.",
          double(st->prompt_tokens));
    gauge("beluga_engine_generation_tokens_total", "counter", "Tokens the engine generated.",
          double(st->generation_tokens));
    gauge("beluga_num_preemptions_total", "counter", "Requests preempted for lack of KV blocks.",
          double(st->preemptions));
    gauge("beluga_engine_steps_total", "counter", "Engine steps.", double(st->steps));
    gauge("beluga_engine_steps_early_total", "counter",
          "Steps launched before the previous step's tokens reached the host (async scheduling).",
          double(st->steps_early));
    gauge("beluga_engine_steps_host_sampled_total", "counter",
          "Steps sampled on the host from copied-back logits (the rest sample on the device).",
          double(st->steps_host_sampled));
    if (!st->spec_accepted_per_position.empty()) {  // speculative decoding is on
      gauge("beluga_spec_decode_num_drafts_total", "counter",
            "Sequence-steps that verified at least one draft token.", double(st->spec_drafts));
      gauge("beluga_spec_decode_num_draft_tokens_total", "counter", "Draft tokens verified.",
            double(st->spec_draft_tokens));
      gauge("beluga_spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.",
            double(st->spec_accepted_tokens));
      metric(out, "beluga_spec_decode_accepted_per_position_total", "counter",
             "Draft tokens accepted at each draft position (0 = the first).");
      for (size_t k = 0; k < st->spec_accepted_per_position.size(); ++k)
        out += "beluga_spec_decode_accepted_per_position_total" + label_with("position", k) + " " +
               num(double(st->spec_accepted_per_position[k])) + "\n";
    }
  }
  render_vllm(st, model, out);
  return out;
}

// vLLM's names for what Beluga measures the same way (vllm/v1/metrics/loggers.py), so vLLM's
// dashboards and alerts read this page as they read vLLM's; its own names are above.
void Metrics::render_vllm(const EngineStats* st, const std::string& model, std::string& out) const {
  const std::string label = "model_name=\"" + model + "\"";
  const std::string lbl = "{" + label + "}";
  auto gauge = [&](const char* name, const char* type, const char* help, double v) {
    sample(out, name, type, help, lbl, v);
  };
  gauge("vllm:prompt_tokens_total", "counter",
        "Prompt tokens of finished requests (beluga_prompt_tokens_total).", double(prompt_tokens_));
  gauge("vllm:generation_tokens_total", "counter",
        "Generated tokens of finished requests (beluga_generation_tokens_total).",
        double(completion_tokens_));
  metric(out, "vllm:time_to_first_token_seconds", "histogram", "Time to first token.");
  ttft_.render("vllm:time_to_first_token_seconds", out, label);
  metric(out, "vllm:time_per_output_token_seconds", "histogram",
         "Mean time per output token after the first, per request.");
  tpot_.render("vllm:time_per_output_token_seconds", out, label);
  metric(out, "vllm:e2e_request_latency_seconds", "histogram", "End-to-end request latency.");
  e2e_.render("vllm:e2e_request_latency_seconds", out, label);
  if (!st) return;
  const double usage = st->kv_blocks_total > 0 ? double(st->kv_blocks_used) / st->kv_blocks_total : 0.0;
  gauge("vllm:num_requests_running", "gauge", "Requests in the engine's running batch.", st->running);
  gauge("vllm:num_requests_waiting", "gauge", "Requests waiting in the engine queue.", st->waiting);
  gauge("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV cache blocks in use (1 = full).", usage);
  gauge("vllm:gpu_cache_usage_perc", "gauge", "Fraction of KV cache blocks in use (vLLM's older name).",
        usage);
  gauge("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
        double(st->prefix_cache_queries));
  gauge("vllm:prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.",
        double(st->prefix_cache_hits));
  gauge("vllm:num_preemptions_total", "counter", "Requests preempted for lack of KV blocks.",
        double(st->preemptions));
}

}  // namespace beluga::server
