// One replica's polling loop, shared by the health checks and the block-events reader: GET a path on
// a fresh connection (connect with the health check's timeout, the response read with its own), hand
// the outcome to `on_result`, and wait as long as it says before the next GET. Runs on its own strand
// until `stopped` is set (no GET starts after that).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "router/router_context.h"

namespace beluga::router {

struct GetRequest {
  std::string target;         // path and query
  size_t body_limit = 65536;  // a longer body fails the read
  int read_timeout_ms = 0;    // 0: the health check's timeout
  bool authorize = false;     // send the router's --replica-api-key
};

// What one GET gave: `ok` when a response was read (any status); `why` says what failed otherwise.
struct GetResult {
  bool ok = false;
  unsigned status = 0;
  std::string body;
  std::string why;
};

// `next` builds each request (called before every GET); `on_result` returns the milliseconds until
// the next one (0: at once).
void start_periodic_get(boost::asio::io_context& ioc, RouterContext& ctx, Replica& replica,
                        std::shared_ptr<std::atomic<bool>> stopped, std::function<GetRequest()> next,
                        std::function<int(const GetResult&)> on_result);

}  // namespace beluga::router
