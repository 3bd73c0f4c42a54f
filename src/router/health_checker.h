// Active health checks: GET /health on every replica, now and then every interval, each on its own
// connection with a timeout (router/periodic_get.h). A 200 counts as a success for the replica's circuit
// breaker (an open one rejoins), anything else (refused, timed out, non-200) as a failure.
#pragma once

#include <memory>

#include "router/router_context.h"

namespace beluga::router {

class HealthChecker {
 public:
  HealthChecker(boost::asio::io_context& ioc, RouterContext& ctx);
  ~HealthChecker();
  void start();
  void stop();  // no probe starts after it

 private:
  boost::asio::io_context& ioc_;
  RouterContext& ctx_;
  std::shared_ptr<std::atomic<bool>> stopped_;
};

}  // namespace beluga::router
