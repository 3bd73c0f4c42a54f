// Child processes for the router tests (tests/common/serve_process.h starts them): `beluga serve`
// replicas on the built-in demo model (one CPU thread each) and `beluga router` in front of them, on
// free loopback ports (netns.h puts replicas on hosts of their own), with passive OpenMP waiting (no
// spinning threads on a small shared machine) and up to 90 s to get ready.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../common/http_client.h"
#include "../common/serve_process.h"

namespace beluga::router::testing {

using beluga::testing::ChildProcess;
using beluga::testing::Clock;
using beluga::testing::demo_model;
using beluga::testing::free_port;
using beluga::testing::seconds_since;

// How the router tests start a child; `ready_marker`: the line that carries its port.
inline beluga::testing::ChildOptions child_options(const std::string& ready_marker) {
  beluga::testing::ChildOptions o;
  o.ready_marker = ready_marker;
  o.ready_timeout = std::chrono::seconds(90);
  o.env = {"OMP_WAIT_POLICY=PASSIVE"};
  return o;
}

// The argv of `beluga serve` on the demo model; `port` 0: any free one.
inline std::vector<std::string> replica_args(int port = 0, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), "--no-access-log");
  return beluga::testing::beluga_args("serve", beluga::testing::serve_flags(demo_model(), 64, extra, port));
}

// `beluga serve` on the demo model, on loopback; `port` 0: any free one.
inline std::unique_ptr<ChildProcess> start_replica(int port = 0, std::vector<std::string> extra = {}) {
  return std::make_unique<ChildProcess>(replica_args(port, std::move(extra)),
                                        child_options("beluga serve: serving "));
}

// `beluga router` on the demo model and any free port, in front of `replica_urls`.
inline std::unique_ptr<ChildProcess> start_router(const std::vector<std::string>& replica_urls,
                                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> flags = {"--model", demo_model(), "--port", "0"};
  for (const auto& u : replica_urls) {
    flags.push_back("--replica");
    flags.push_back(u);
  }
  flags.insert(flags.end(), extra.begin(), extra.end());
  return std::make_unique<ChildProcess>(beluga::testing::beluga_args("router", flags),
                                        child_options("beluga router: routing to "));
}

// Polls `cond` every 50 ms for up to `seconds`; its last answer.
inline bool wait_for(const std::function<bool()>& cond, double seconds) {
  const auto t0 = Clock::now();
  while (seconds_since(t0) < seconds) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

// The value of the sample `name{labels}` in a Prometheus page; -1 when absent.
inline double sample(const std::string& page, const std::string& name_and_labels) {
  const std::string key = name_and_labels + " ";
  for (size_t pos = page.find(key); pos != std::string::npos; pos = page.find(key, pos + 1))
    if (pos == 0 || page[pos - 1] == '\n') return std::stod(page.substr(pos + key.size()));
  return -1;
}

// A router's per-replica sample `family{replica="url"}`.
inline double replica_sample(int router_port, const std::string& family, const std::string& url) {
  return sample(beluga::server::testing::http_get(router_port, "/metrics").body,
                family + "{replica=\"" + url + "\"}");
}

// A raw loopback connection that has sent `POST path` with a JSON `body` (for tests that walk away
// mid-response); reads on it time out after `recv_timeout_ms`. The caller closes it.
inline int post_raw(int port, const std::string& path, const std::string& body, int recv_timeout_ms) {
  const std::string req = "POST " + path +
                          " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{recv_timeout_ms / 1000, 1000 * (recv_timeout_ms % 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      send(fd, req.data(), req.size(), MSG_NOSIGNAL) != ssize_t(req.size())) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace beluga::router::testing
