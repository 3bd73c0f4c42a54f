// `beluga router`: an HTTP load balancer in front of `beluga serve` replicas (Boost.Beast on Asio,
// N I/O threads, one strand per connection). Serves the replicas' APIs by proxying them
// (proxy_session.h), its own /metrics (router_metrics.h), /health and /ready (200 while a replica
// takes traffic), and probes the replicas (health_checker.h).
#pragma once

#include <memory>

#include "router/prompt_tokens.h"
#include "router/router_config.h"

namespace beluga::router {

class Router {
 public:
  // `model` renders and tokenizes prompts for the cache-aware policy (null: routes by load alone).
  // Resolves the replicas' addresses (throws beluga::Error on a bad one).
  Router(RouterConfig cfg, std::unique_ptr<PromptModel> model);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  void listen();  // throws beluga::Error when the address is taken
  int port() const;
  size_t num_replicas() const;  // --replica's and the buckets' URLs, each once
  void start();                 // I/O threads and health checks in the background
  // Blocks until SIGINT/SIGTERM (blocked by the caller beforehand, as Server::block_signals does).
  void wait_for_signal();
  void stop();

  struct State;  // router.cc

 private:
  std::unique_ptr<State> st_;
};

}  // namespace beluga::router
