// The HTTP server: Boost.Beast on Asio, one strand per connection, N I/O threads.
// Routes: POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages;
// GET /v1/models, /health, /metrics; GET and DELETE /v1/responses/{id} (stored responses, see
// response_store.h). Generation responses stream as SSE when asked; engine outputs
// (delivered on the engine thread) are posted to the connection's strand. A client that goes away
// mid-request has its engine request aborted. Bad input gets the API's own error JSON and status.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "server/engine_handle.h"
#include "server/metrics.h"
#include "server/request_builder.h"

namespace beluga::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                    // 0: any free port (see Server::port())
  std::string api_key;                // empty: no authentication
  size_t max_body_bytes = 16u << 20;  // larger bodies get 413
  int io_threads = 2;
  int idle_timeout_s = 300;  // keep-alive connections idle this long are closed
  // Responses kept for previous_response_id and GET /v1/responses/{id} (least recently used evicted
  // first); 0 stores none (responses then report store: false).
  size_t max_stored_responses = 1024;
  bool access_log = true;  // one line per request on stderr (access_log.h)
};

class Server {
 public:
  explicit Server(ServerConfig cfg);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds and listens (throws beluga::Error when the address is taken). Until set_engine, /health
  // answers 503 and generation routes 503.
  void listen();
  int port() const;
  // The engine and the model facts; from here on the server serves. `engine` must outlive the
  // server's I/O (call stop() before destroying it).
  void set_engine(EngineHandle* engine, ModelInfo info);

  // Runs the I/O threads in the background.
  void start();
  // Blocks SIGINT/SIGTERM in the calling thread (and the threads it starts later) and ignores
  // SIGPIPE; call it first thing in main, before any thread exists, so wait_for_signal sees them.
  static void block_signals();
  // Blocks until SIGINT/SIGTERM or stop().
  void wait_for_signal();
  // Stops accepting and joins the I/O threads.
  // Shutdown order: stop(), then destroy the engine (its pending callbacks own sessions whose sockets
  // belong to this server's io_context), then the Server.
  void stop();

  Metrics& metrics();

  struct State;  // internal (server.cc)

 private:
  std::shared_ptr<State> st_;
};

}  // namespace beluga::server
