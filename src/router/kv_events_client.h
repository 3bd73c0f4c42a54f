// Reads every replica's KV block events (GET /v1/kv/events, server/kv_events_route.h) into the
// router's KvIndex: one loop per replica, each read on its own connection with the health check's
// timeout, after its last seq and epoch; again at once while the replica has more, else every
// kv_events_interval_ms. The first read of a replica (and of one restarted, whose epoch changed) is a
// snapshot, so a router restart or a replica restart rebuilds that replica's index. A replica that
// answers 404 (no events) or fails stays on the approximate index; it is asked again later.
#pragma once

#include <atomic>
#include <memory>

#include "router/router_context.h"

namespace beluga::router {

class KvEventsClient {
 public:
  KvEventsClient(boost::asio::io_context& ioc, RouterContext& ctx);
  ~KvEventsClient();
  void start();
  void stop();  // no read starts after it

 private:
  boost::asio::io_context& ioc_;
  RouterContext& ctx_;
  std::shared_ptr<std::atomic<bool>> stopped_;
};

}  // namespace beluga::router
