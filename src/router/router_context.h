// What every connection of the router shares: the configuration, the replicas (with their resolved
// addresses), the prefix indexes (approximate and from block events), the length buckets, the Responses
// affinity map, the metrics, the prompt model (null: no tokenizing, so cache-aware routes by load alone) and
// the pool that tokenizes off the I/O threads.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>

#include "router/bucket.h"
#include "router/kv_index.h"
#include "router/prefix_index.h"
#include "router/prompt_tokens.h"
#include "router/replica.h"
#include "router/response_affinity.h"
#include "router/router_config.h"
#include "router/router_metrics.h"

namespace beluga::router {

struct RouterContext {
  RouterContext(RouterConfig c, std::unique_ptr<PromptModel> m)
      : cfg(std::move(c)), index(cfg.index_blocks), responses(cfg.max_response_ids), model(std::move(m)) {}

  const RouterConfig cfg;
  const bool disaggregated = !cfg.prefill.empty() || !cfg.decode.empty();
  std::vector<std::unique_ptr<Replica>> replicas;
  std::vector<std::vector<boost::asio::ip::tcp::endpoint>> endpoints;  // per replica id
  PrefixIndex index;               // approximate: for the replicas that publish no block events
  KvIndex kv_index{kMaxReplicas};  // exact, from the block events
  Buckets buckets;                 // over the replica ids
  ResponseAffinity responses;
  RouterMetrics metrics;
  const std::unique_ptr<PromptModel> model;
  boost::asio::thread_pool* tokenize_pool = nullptr;
  std::atomic<uint64_t> ticket{0};  // the policies' rotation

  // A breaker opened: the replica's cache is presumed lost and its idle connections dead.
  void on_ejected(Replica& r, const std::string& why);
  // An open breaker let traffic through again (a probe succeeded).
  void on_rejoined(Replica& r);
};

}  // namespace beluga::router
