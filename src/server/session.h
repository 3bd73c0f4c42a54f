// One HTTP connection (internal to src/server): reads requests (with header, body and idle
// timeouts), routes them (health, readiness, metrics, the web page, utility routes, models, stored
// responses; generation routes go to its Generation), and writes responses and streams. Lives on
// its own strand; handlers hold a shared_ptr to it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "server/generation.h"
#include "server/server_state.h"

namespace beluga::server {

class Session : public std::enable_shared_from_this<Session> {
 public:
  using Request = boost::beast::http::request<boost::beast::http::string_body>;

  Session(boost::asio::ip::tcp::socket&& socket, Server::State& st);
  ~Session();

  void run();

  // Runs `f` on this connection's strand.
  template <class F>
  void post(F&& f) {
    boost::asio::post(exec_, std::forward<F>(f));
  }

  // Server::drain began: a connection waiting for its next request closes now; a busy one closes
  // after its response (responses then say Connection: close).
  void on_drain();
  // The drain's grace period ended with this request still running: it ends now, a stream with the
  // API's error event, any other request with a 503.
  void on_shutdown();

 private:
  friend class Generation;  // writes its response through this connection

  // Reading requests.
  void do_read();
  void read_header();
  void on_header(boost::beast::error_code ec);
  void read_body();
  void on_read_error(boost::beast::error_code ec);
  void on_read(boost::beast::error_code ec);
  void fail_internal(recipe::Api eapi, std::string_view what) noexcept;
  void end_with_error(recipe::Api eapi, int status, const std::string& msg);
  void sync_busy();

  // Routing.
  static std::string presented_key(const Request& req);
  void route(Request& req);
  void handle_stored_response(const Request& req, const std::string& id);

  // Watching for a client that leaves while its request is built or generated.
  void on_client_gone();
  void arm_watch();
  void on_watch(boost::beast::error_code ec, size_t n);

  // Writing.
  void send_json(int status, const nlohmann::json& body);
  void send_json(int status, const nlohmann::ordered_json& body);
  void send_error(recipe::Api api, int status, const std::string& message, const std::string& param);
  void log_access(int status);
  void send_response(int status, std::string_view content_type, std::string_view body);
  void queue_body(const std::string& data);
  void queue_raw(std::string data);
  void do_write();
  void on_write(boost::beast::error_code ec);
  // The response (or stream) is complete: the next request, or the close.
  void end_response();
  void after_response();
  void do_close();
  void discard_input();

  Server::State& st_;
  boost::beast::tcp_stream stream_;
  const boost::asio::any_io_executor exec_;
  boost::beast::flat_buffer buffer_;
  std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  bool keep_alive_ = true, http11_ = true, closed_ = false, drain_on_close_ = false;
  bool head_sent_ = false;  // this request's response (or stream) head is queued
  size_t drained_ = 0;
  uint64_t served_ = 0;     // requests read on this connection
  bool idle_wait_ = false;  // waiting for the next request's first byte
  bool counted_busy_ = false, shutting_down_ = false;
  std::string label_ = "other";
  std::string access_client_, access_method_, access_path_;  // for the access log
  std::chrono::steady_clock::time_point access_start_;

  Generation gen_{*this};  // the generation in flight, if any

  // Writes.
  std::string pending_, inflight_;
  bool writing_ = false, response_complete_ = false;
  bool watching_ = false, resume_after_watch_ = false;
};

}  // namespace beluga::server
