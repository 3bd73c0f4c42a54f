// What the server's parts share (internal to src/server): the configuration, the metrics, the
// listening socket and I/O threads, the engine and model facts once set, and the pools and stores
// that requests use. Owned by Server; sessions hold a reference, valid until Server::stop() joined
// the I/O threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>

#include "server/build_pool.h"
#include "server/engine_health.h"
#include "server/graceful_drain.h"
#include "server/response_store.h"
#include "server/server.h"
#include "server/sse.h"

namespace beluga::server {

struct Server::State {
  // What a Session's destructor touches comes first, so that it outlives the io_context (whose
  // destructor destroys the handlers, and the sessions they hold, that never ran).
  ServerConfig cfg;
  Metrics metrics;
  std::mutex mu;
  std::condition_variable cv;       // signalled when `stopping` is set
  bool stopping = false;            // guarded by `mu`
  std::atomic<int> connections{0};  // open sessions (for max_connections)
  GracefulDrain drain;              // the sessions and how many are busy (see Server::drain)

  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor acceptor{ioc};
  std::atomic<bool> ready{false};
  EngineHandle* engine = nullptr;
  ModelInfo info;
  std::unique_ptr<ResponseStore> responses;
  std::unique_ptr<BuildPool> builds;
  std::unique_ptr<EngineHealth> health;
  std::vector<std::thread> threads;
  // Prefill for other engines (disaggregation.h): KV transfers block, so not on the I/O threads
  // nor the build pool. Created with the engine when the server has a transfer; destroyed first.
  std::unique_ptr<boost::asio::thread_pool> transfers;
  int64_t started = unix_seconds();

  HealthVerdict engine_verdict() {
    if (!ready) return {false, "loading"};
    if (auto why = engine->unavailable()) return {false, *why};
    return health->observe(engine->stats(), std::chrono::steady_clock::now(), engine->generation());
  }
};

}  // namespace beluga::server
