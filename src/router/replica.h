// A replica behind the router: its address, the load the router has put on it (requests in flight),
// its counters for /metrics, its circuit breaker, and the keep-alive connections to it that sit idle
// between requests (taken by the next request, so a request rarely pays for a TCP handshake).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "router/circuit_breaker.h"

namespace beluga::router {

// What a replica does (`beluga serve --role`): everything, or one side of disaggregated serving.
enum class ReplicaRole { kBoth, kPrefill, kDecode };

struct ReplicaAddress {
  std::string host, port;
  std::string url;  // http://host:port, as /metrics labels it
};

// "http://host:port", "host:port" (a path after it is ignored); https and a missing port are errors.
ReplicaAddress parse_replica_url(std::string_view url);

struct ReplicaCounters {
  std::atomic<uint64_t> requests{0};       // attempts sent to it
  std::atomic<uint64_t> failures{0};       // attempts that got no usable response
  std::atomic<uint64_t> retries{0};        // attempts that failed here and were retried elsewhere
  std::atomic<uint64_t> prompt_tokens{0};  // prompt tokens routed to it (cache-aware policy)
  std::atomic<uint64_t> hit_tokens{0};     // of those, the estimated cached prefix
  std::atomic<uint64_t> stream_errors{0};  // streams it broke off after they began
  // Its block events (kv_events_client.h): blocks held now, epochs seen, pages applied.
  std::atomic<uint64_t> kv_blocks{0};
  std::atomic<uint64_t> kv_epochs{0};
  std::atomic<uint64_t> kv_pages{0};
};

class Replica {
 public:
  Replica(int id, ReplicaAddress address, int eject_after, ReplicaRole role = ReplicaRole::kBoth);
  ~Replica();
  Replica(const Replica&) = delete;
  Replica& operator=(const Replica&) = delete;

  int id() const { return id_; }
  ReplicaRole role() const { return role_; }
  // A decode replica's KV transfer address ("host:port", from its /health); empty until known.
  std::string kv_address() const;
  void set_kv_address(std::string a);
  const ReplicaAddress& address() const { return address_; }
  CircuitBreaker& breaker() { return breaker_; }
  const CircuitBreaker& breaker() const { return breaker_; }
  ReplicaCounters& counters() { return counters_; }
  const ReplicaCounters& counters() const { return counters_; }

  std::atomic<int> in_flight{0};
  // A decode engine's KV usage (0..1) as its last /health reported it.
  std::atomic<double> kv_usage{0};

  // An idle keep-alive connection's descriptor (checked to be still open), or -1. The caller owns it.
  int take_idle();
  // Keeps `fd` for the next request (closed instead past the cap).
  void put_idle(int fd);
  // Closes every idle connection (the replica failed: they are probably dead).
  void drop_idle();

 private:
  const int id_;
  const ReplicaAddress address_;
  const ReplicaRole role_;
  mutable std::mutex kv_mu_;
  std::string kv_address_;
  CircuitBreaker breaker_;
  ReplicaCounters counters_;
  std::mutex mu_;
  std::vector<int> idle_;
};

}  // namespace beluga::router
