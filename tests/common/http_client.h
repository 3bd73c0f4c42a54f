// Small blocking HTTP/1.1 helpers for tests: one request per connection (with a deadline), a raw
// connection for tests that script the bytes themselves, SSE frame parsing, Prometheus gauge lookup.
// The Beast/Asio code lives in http_client.cc (compiled once, in beluga_test_process): this header
// includes no Boost header, so the many test TUs that include it stay cheap to compile.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace beluga::server::testing {

// The request methods the tests use.
enum class Verb { get, post, delete_ };

struct HttpReply {
  int status = 0;  // 0: no response (connection closed or timed out)
  std::string body;
  std::string content_type;
  std::string retry_after;  // the Retry-After header, if any
  bool keep_alive = false;  // the response leaves the connection open
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
};

// One request to `host` (an IPv4 or IPv6 address) on a fresh connection, with a deadline for the
// whole exchange. Content-Type is application/json; `headers` are set after it.
HttpReply http_request(const std::string& host, int port, Verb verb, const std::string& target,
                       const std::string& body = "",
                       const std::vector<std::pair<std::string, std::string>>& headers = {},
                       std::chrono::seconds timeout = std::chrono::seconds(30));

// The same on loopback (127.0.0.1).
HttpReply http_request(int port, Verb verb, const std::string& target, const std::string& body = "",
                       const std::vector<std::pair<std::string, std::string>>& headers = {},
                       std::chrono::seconds timeout = std::chrono::seconds(30));

inline HttpReply http_get(const std::string& host, int port, const std::string& target,
                          std::chrono::seconds timeout = std::chrono::seconds(30)) {
  return http_request(host, port, Verb::get, target, "", {}, timeout);
}
inline HttpReply http_get(int port, const std::string& target,
                          std::chrono::seconds timeout = std::chrono::seconds(30)) {
  return http_request(port, Verb::get, target, "", {}, timeout);
}
// GET /health's status once it is 200, or the last one after `seconds` (a loading or restarting
// instance answers 503).
int wait_for_health(int port, double seconds);
inline HttpReply http_post(int port, const std::string& target, const nlohmann::json& body,
                           const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  return http_request(port, Verb::post, target, body.dump(), headers);
}

// A plain blocking TCP connection to a loopback port, for tests that send their own bytes (partial
// headers, held or silent connections, several requests on one connection). Closed when it goes
// away. The throwing calls throw std::system_error.
class RawConnection {
 public:
  // Connects to 127.0.0.1:`port`; throws when that fails.
  static RawConnection connect(int port);
  // The same, empty when connecting fails.
  static std::optional<RawConnection> try_connect(int port);

  RawConnection(RawConnection&&) noexcept;
  RawConnection& operator=(RawConnection&&) noexcept;
  ~RawConnection();

  // Writes all of `bytes`; throws on error.
  void send(const std::string& bytes);
  // Reads one HTTP response (bytes past it stay buffered for the next call); throws on error,
  // including the connection closing first.
  HttpReply read_response();
  // What one read returns (at most `max` bytes, at least one); throws on error or end of stream.
  std::string read_some(std::size_t max);
  // The same; on error or end of stream sets `ec` and returns "".
  std::string read_some(std::size_t max, std::error_code& ec);
  void close();
  // The socket's descriptor, for setsockopt / recv.
  int fd() const;

 private:
  struct Impl;
  explicit RawConnection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// SSE frames of a streamed body: each one's event name (empty: none) and data payload.
struct SseEvent {
  std::string event;
  std::string data;
};
std::vector<SseEvent> parse_sse(const std::string& body);

// A gauge's value in a Prometheus text page (the first sample of that name), or -1.
double metric_value(const std::string& page, const std::string& name);

}  // namespace beluga::server::testing
