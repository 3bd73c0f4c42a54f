// The HTTP server: Boost.Beast on Asio, one strand per connection, N I/O threads.
// Routes: POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/messages;
// GET /v1/models, /health (liveness: the engine makes progress without failing), /ready (503 while
// loading, draining or unhealthy), /metrics; GET and DELETE /v1/responses/{id} (stored responses, see
// response_store.h). Generation responses stream as SSE when asked; engine outputs
// (delivered on the engine thread) are posted to the connection's strand. A client that goes away
// mid-request has its engine request aborted. Bad input gets the API's own error JSON and status.
#pragma once

#include <chrono>
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
  // A request's headers must arrive within this many seconds of its first byte (of the connection's
  // opening, for a new one), and its body within body_timeout_s after them; slower clients are
  // dropped, so a slow sender cannot hold a connection for the idle timeout.
  int header_timeout_s = 15;
  int body_timeout_s = 60;
  // Open connections; one past the cap is answered 503 (the API's error JSON) and closed.
  int max_connections = 1024;
  // Threads that parse, template and tokenize request bodies (off the I/O threads), and how many
  // requests may wait for one; past that, 503.
  int build_threads = 2;
  size_t build_queue = 64;
  // /health and /ready answer 503 when requests wait or run but no engine step finished for this
  // long (see engine_health.h), or when most recent steps failed.
  int engine_stall_s = 60;
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
  // Graceful shutdown: stops accepting, /ready and new generation requests answer 503, idle
  // connections close and busy ones close after their response; waits up to `grace` for requests
  // in flight (streams included) to finish, then cuts the rest short (streams end with the API's
  // error event, other requests get a 503) and gives those replies a few seconds to go out. True
  // when everything finished within the grace period. Call stop() after it.
  bool drain(std::chrono::seconds grace);
  // Stops accepting and joins the I/O threads.
  // Shutdown order: stop(), then destroy the engine (its pending callbacks own sessions whose sockets
  // belong to this server's io_context), then the Server.
  void stop();

  Metrics& metrics();

  struct State;  // internal (server_state.h)

 private:
  std::shared_ptr<State> st_;
};

}  // namespace beluga::server
