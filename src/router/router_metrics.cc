#include "router/router_metrics.h"

namespace beluga::router {

namespace {

void family(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const char* name, const std::string& labels, double v) {
  out += name;
  if (!labels.empty()) out += "{" + labels + "}";
  out += ' ';
  const uint64_t u = uint64_t(v);
  out += double(u) == v ? std::to_string(u) : std::to_string(v);
  out += '\n';
}

}  // namespace

std::string RouterMetrics::render(const std::vector<std::unique_ptr<Replica>>& replicas,
                                  size_t index_blocks) const {
  std::string out;
  out.reserve(4096);
  family(out, "beluga_router_requests_total", "counter", "Client requests the router proxied.");
  sample(out, "beluga_router_requests_total", "", double(requests_.load()));
  family(out, "beluga_router_retries_total", "counter", "Attempts retried on another replica.");
  sample(out, "beluga_router_retries_total", "", double(retries_.load()));
  family(out, "beluga_router_unroutable_total", "counter", "Requests answered 503: no replica available.");
  sample(out, "beluga_router_unroutable_total", "", double(unroutable_.load()));
  family(
      out, "beluga_router_prefills_total", "counter",
      "Prefill legs of disaggregated requests, by result (failed: the decode engine computed the prompt).");
  const char* results[] = {"ok", "failed", "skipped"};
  for (size_t i = 0; i < 3; ++i)
    sample(out, "beluga_router_prefills_total", std::string("result=\"") + results[i] + "\"",
           double(prefills_[i].load()));
  family(out, "beluga_router_prefill_seconds_total", "counter",
         "Time of the prefill legs, request to report (prompt computed and its KV sent).");
  sample(out, "beluga_router_prefill_seconds_total", "", double(prefill_micros_.load()) * 1e-6);
  family(out, "beluga_router_prefix_index_blocks", "gauge",
         "Blocks in the router's approximate prefix index.");
  sample(out, "beluga_router_prefix_index_blocks", "", double(index_blocks));

  family(out, "beluga_router_decisions_total", "counter", "Routing decisions, by policy and kind.");
  for (Policy p : {Policy::kCacheAware, Policy::kRoundRobin, Policy::kLeastLoad})
    for (int d = 0; d < kNumDecisions; ++d) {
      const uint64_t v = decisions_[size_t(p)][size_t(d)].load();
      if (v == 0) continue;
      sample(out, "beluga_router_decisions_total",
             std::string("policy=\"") + policy_name(p) + "\",decision=\"" + decision_name(Decision(d)) + "\"",
             double(v));
    }

  struct Family {
    const char* name;
    const char* type;
    const char* help;
    double (*value)(const Replica&);
  };
  static constexpr Family kFamilies[] = {
      {"beluga_router_replica_requests_total", "counter", "Attempts sent to the replica.",
       [](const Replica& r) { return double(r.counters().requests.load()); }},
      {"beluga_router_replica_in_flight", "gauge", "Requests in flight on the replica.",
       [](const Replica& r) { return double(r.in_flight.load()); }},
      {"beluga_router_replica_failures_total", "counter", "Attempts that got no usable response.",
       [](const Replica& r) { return double(r.counters().failures.load()); }},
      {"beluga_router_replica_retries_total", "counter",
       "Attempts that failed there and were retried elsewhere.",
       [](const Replica& r) { return double(r.counters().retries.load()); }},
      {"beluga_router_replica_breaker_state", "gauge",
       "Circuit breaker: 0 closed, 1 open (ejected), 2 half-open.",
       [](const Replica& r) { return double(int(r.breaker().state())); }},
      {"beluga_router_replica_ejections_total", "counter", "Times the breaker opened.",
       [](const Replica& r) { return double(r.breaker().ejections()); }},
      {"beluga_router_replica_routed_prompt_tokens_total", "counter",
       "Prompt tokens of requests routed there (cache-aware policy).",
       [](const Replica& r) { return double(r.counters().prompt_tokens.load()); }},
      {"beluga_router_replica_routed_hit_tokens_total", "counter",
       "Of those, the prefix the router estimated cached there.",
       [](const Replica& r) { return double(r.counters().hit_tokens.load()); }},
      {"beluga_router_replica_stream_errors_total", "counter", "Streams broken off after they began.",
       [](const Replica& r) { return double(r.counters().stream_errors.load()); }},
      {"beluga_router_replica_kv_blocks", "gauge",
       "Blocks the replica holds in some tier, from its block events (0 without them).",
       [](const Replica& r) { return double(r.counters().kv_blocks.load()); }},
      {"beluga_router_replica_kv_usage", "gauge",
       "A decode engine's KV blocks in use (0..1), from its /health: the decode balancer weighs it.",
       [](const Replica& r) { return r.kv_usage.load(); }},
      {"beluga_router_replica_kv_epochs_total", "counter",
       "Event epochs seen: 1 after the first read of its block events, one more per restart.",
       [](const Replica& r) { return double(r.counters().kv_epochs.load()); }},
      {"beluga_router_replica_kv_event_pages_total", "counter",
       "Pages of its block events applied that held events or a snapshot.",
       [](const Replica& r) { return double(r.counters().kv_pages.load()); }},
  };
  for (const auto& f : kFamilies) {
    family(out, f.name, f.type, f.help);
    for (const auto& r : replicas) sample(out, f.name, "replica=\"" + r->address().url + "\"", f.value(*r));
  }
  return out;
}

}  // namespace beluga::router
