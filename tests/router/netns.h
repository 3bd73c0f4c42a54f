// Replica hosts for the router's end-to-end tests: where the machine allows it, each replica runs as
// a host of its own, `ip netns exec NS beluga serve --host ADDR` in a network namespace joined to this
// one by a veth pair (a /30 of 198.18.0.0/15, the benchmarking range, in a /27 block chosen per test
// process from its pid and not on any local interface), so the router, here, reaches it at ADDR and
// not over loopback. "Allows" is found out by doing it: creating the namespaces and links, bringing
// them up, and connecting from here to a socket listening inside; any failure (not root, no `ip`, a
// container without the capability), or BELUGA_TEST_NO_NETNS=1, and every replica is on 127.0.0.1
// instead. The constructor prints which. The destructor deletes the namespaces and links (after
// killing anything still running in them); namespaces left by a test process that died (SIGKILL), and
// the replicas still running in them, are deleted by the next one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "processes.h"

namespace beluga::router::testing {

class ReplicaHosts {
 public:
  explicit ReplicaHosts(int count);  // count <= 8
  ~ReplicaHosts();
  ReplicaHosts(const ReplicaHosts&) = delete;
  ReplicaHosts& operator=(const ReplicaHosts&) = delete;

  bool in_namespaces() const { return !namespaces_.empty(); }
  const std::string& mode() const { return mode_; }  // the line the constructor printed
  // The address host `i` listens on: its veth address, or 127.0.0.1.
  std::string address(int i) const;
  std::string url(int i, int port) const { return "http://" + address(i) + ":" + std::to_string(port); }

  // `beluga serve` (processes.h's replica_args) as host `i`; `port` 0: any free one there.
  std::unique_ptr<ChildProcess> start_replica(int i, int port = 0, std::vector<std::string> extra = {}) const;

  // In namespaces, what shows that `replica` is not pretending to be host `i`: it runs in i's network
  // namespace, answers GET /health at address(i), and nothing here listens on 127.0.0.1 at its port.
  // Empty when it holds (always, on loopback); else what does not.
  std::string not_its_own_host(ChildProcess& replica, int i) const;

 private:
  void tear_down();

  std::string ip_;                       // the `ip` binary
  std::vector<std::string> namespaces_;  // empty: loopback
  std::vector<std::string> links_;       // the veth ends in this namespace
  uint32_t block_ = 0;                   // the /27's first address (host order)
  std::string mode_;
};

}  // namespace beluga::router::testing
