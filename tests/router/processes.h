// Child processes for the router tests (tests/common/serve_process.h starts them): `beluga serve`
// replicas on the built-in demo model (one CPU thread each) and `beluga router` in front of them, on
// free loopback ports, with passive OpenMP waiting (no spinning threads on a small shared machine)
// and up to 90 s to get ready.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

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

// `beluga serve` on the demo model; `port` 0: any free one.
inline std::unique_ptr<ChildProcess> start_replica(int port = 0, std::vector<std::string> extra = {}) {
  extra.insert(extra.begin(), "--no-access-log");
  return std::make_unique<ChildProcess>(
      beluga::testing::beluga_args("serve", beluga::testing::serve_flags(demo_model(), 64, extra, port)),
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

}  // namespace beluga::router::testing
