// One client connection of the router. Reads a request; answers /metrics, /health and /ready itself;
// proxies everything else to a replica the policy picks (generation routes tokenized first when the
// policy is cache-aware). The request goes upstream with its headers (Authorization, x-api-key,
// x-traffic-class, ...) minus the hop-by-hop ones; the response comes back piece by piece as it
// arrives (SSE events are never held back for more). Until its first byte goes to the client, a
// request whose replica refuses, fails or times out is retried on another one; a stream broken off
// later ends with the API's error event. A client that leaves closes the upstream connection (the
// replica then aborts the request). Keep-alive on both sides.
#pragma once

#include <memory>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>

#include "router/router_context.h"

namespace beluga::router {

// Starts serving `socket` (accepted on a strand of the router's io_context).
void start_proxy_session(boost::asio::ip::tcp::socket socket, RouterContext& ctx);

}  // namespace beluga::router
