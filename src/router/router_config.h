// What `beluga router` is told: where to listen, the replicas, the policy and its cost knobs, and the
// limits and timeouts of the proxy, its health checks and its circuit breakers.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "router/bucket.h"
#include "router/policy.h"

namespace beluga::router {

struct RouterConfig {
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (Router::port())
  std::vector<std::string> replicas;  // http://HOST:PORT each (at most 64 replicas in all)
  // Disaggregated serving instead (both given, no `replicas`): engines started with --role prefill
  // and --role decode (docs/disaggregation.md).
  std::vector<std::string> prefill, decode;
  Policy policy = Policy::kCacheAware;
  CostKnobs knobs;
  size_t index_blocks = size_t(1) << 20;  // prefix index capacity (~100 bytes per block)
  int io_threads = 2;
  int tokenize_threads = 1;  // render + tokenize prompts off the I/O threads (cache-aware)
  // Faults: retries on other replicas for a request that has not sent its client a byte; the
  // connect timeout; how long a replica may take to begin its response (a non-streamed response
  // begins when it is complete) and between two reads of a stream.
  int max_retries = 2;
  int connect_timeout_ms = 2000;
  int upstream_timeout_s = 600;
  // Health checks (GET /health every interval) and the breaker: ejected after this many
  // consecutive failures, back on the first successful probe.
  int health_interval_ms = 1000;
  int health_timeout_ms = 1000;
  int eject_after = 3;
  // Client side, as `beluga serve`'s.
  size_t max_body_bytes = size_t(16) << 20;
  int idle_timeout_s = 300;
  int header_timeout_s = 15;
  int body_timeout_s = 60;
  size_t max_response_ids = 65536;  // Responses ids remembered for previous_response_id affinity
  bool log_replica_changes = true;  // ejections and rejoins on stderr
  // KV block events (router/kv_events_client.h): each replica's GET /v1/kv/events this often (at
  // once again while it has more), with this API key (the replicas' --api-key; empty: none).
  int kv_events_interval_ms = 100;
  std::string replica_api_key;
  std::vector<BucketSpec> buckets;  // prefill-length buckets (router/bucket.h); empty: none
};

}  // namespace beluga::router
