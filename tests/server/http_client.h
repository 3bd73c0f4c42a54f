// Small blocking HTTP/1.1 helpers for server tests: one request per connection (with a deadline),
// SSE frame parsing, Prometheus gauge lookup.
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace beluga::server::testing {

struct HttpReply {
  int status = 0;  // 0: no response (connection closed or timed out)
  std::string body;
  std::string content_type;
  nlohmann::json json() const { return nlohmann::json::parse(body, nullptr, false); }
};

// One request to `host` (an IPv4 or IPv6 address) on a fresh connection, with a deadline for the
// whole exchange.
inline HttpReply http_request(const std::string& host, int port, boost::beast::http::verb verb,
                              const std::string& target, const std::string& body = "",
                              const std::vector<std::pair<std::string, std::string>>& headers = {},
                              std::chrono::seconds timeout = std::chrono::seconds(30)) {
  namespace beast = boost::beast;
  namespace http = beast::http;
  boost::asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  HttpReply r;
  beast::error_code ec;
  stream.expires_after(timeout);
  const auto address = boost::asio::ip::make_address(host, ec);
  if (ec) return r;
  stream.connect(boost::asio::ip::tcp::endpoint(address, static_cast<unsigned short>(port)), ec);
  if (ec) return r;
  http::request<http::string_body> req(verb, target, 11);
  req.set(http::field::host, host);
  req.set(http::field::content_type, "application/json");
  for (const auto& [k, v] : headers) req.set(k, v);
  req.body() = body;
  req.prepare_payload();
  // Blocking calls on a tcp_stream ignore its timer: run the async forms with a deadline instead.
  http::async_write(stream, req, [&](beast::error_code e, size_t) { ec = e; });
  ioc.run();
  if (ec) return r;
  ioc.restart();
  beast::flat_buffer buf;
  http::response_parser<http::string_body> p;
  p.body_limit(64u << 20);
  http::async_read(stream, buf, p, [&](beast::error_code e, size_t) { ec = e; });
  ioc.run();
  if (ec) return r;
  r.status = int(p.get().result_int());
  r.body = p.get().body();
  r.content_type = std::string(p.get()[http::field::content_type]);
  return r;
}

// The same on loopback (127.0.0.1).
inline HttpReply http_request(int port, boost::beast::http::verb verb, const std::string& target,
                              const std::string& body = "",
                              const std::vector<std::pair<std::string, std::string>>& headers = {},
                              std::chrono::seconds timeout = std::chrono::seconds(30)) {
  return http_request("127.0.0.1", port, verb, target, body, headers, timeout);
}

inline HttpReply http_get(const std::string& host, int port, const std::string& target,
                          std::chrono::seconds timeout = std::chrono::seconds(30)) {
  return http_request(host, port, boost::beast::http::verb::get, target, "", {}, timeout);
}
inline HttpReply http_get(int port, const std::string& target,
                          std::chrono::seconds timeout = std::chrono::seconds(30)) {
  return http_request(port, boost::beast::http::verb::get, target, "", {}, timeout);
}
inline HttpReply http_post(int port, const std::string& target, const nlohmann::json& body,
                           const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  return http_request(port, boost::beast::http::verb::post, target, body.dump(), headers);
}

// SSE frames of a streamed body: each one's event name (empty: none) and data payload.
struct SseEvent {
  std::string event;
  std::string data;
};
inline std::vector<SseEvent> parse_sse(const std::string& body) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) break;
    std::string frame = body.substr(pos, end - pos);
    pos = end + 2;
    SseEvent e;
    size_t lp = 0;
    while (lp < frame.size()) {
      size_t le = frame.find('\n', lp);
      if (le == std::string::npos) le = frame.size();
      std::string line = frame.substr(lp, le - lp);
      if (line.rfind("event: ", 0) == 0) e.event = line.substr(7);
      if (line.rfind("data: ", 0) == 0) e.data = line.substr(6);
      lp = le + 1;
    }
    out.push_back(e);
  }
  return out;
}

// A gauge's value in a Prometheus text page (the first sample of that name), or -1.
inline double metric_value(const std::string& page, const std::string& name) {
  size_t pos = 0;
  while ((pos = page.find(name, pos)) != std::string::npos) {
    const bool line_start = pos == 0 || page[pos - 1] == '\n';
    const char after = pos + name.size() < page.size() ? page[pos + name.size()] : '\0';
    if (line_start && (after == ' ' || after == '{')) {
      size_t sp = page.find(' ', pos + name.size());
      if (sp == std::string::npos) return -1;
      return std::stod(page.substr(sp + 1));
    }
    pos += name.size();
  }
  return -1;
}

}  // namespace beluga::server::testing
