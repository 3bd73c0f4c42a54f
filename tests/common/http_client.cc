// The Beast/Asio side of http_client.h, compiled once for every test binary that links
// beluga_test_process.
#include "http_client.h"

#include <chrono>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace beluga::server::testing {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

http::verb to_beast(Verb v) {
  switch (v) {
    case Verb::get:
      return http::verb::get;
    case Verb::post:
      return http::verb::post;
    case Verb::delete_:
      return http::verb::delete_;
  }
  return http::verb::unknown;
}

HttpReply to_reply(const http::response<http::string_body>& res) {
  HttpReply r;
  r.status = int(res.result_int());
  r.body = res.body();
  r.content_type = std::string(res[http::field::content_type]);
  r.retry_after = std::string(res[http::field::retry_after]);
  r.keep_alive = res.keep_alive();
  return r;
}

[[noreturn]] void throw_error(const beast::error_code& ec, const char* what) {
  throw std::system_error(std::error_code(ec), what);
}

}  // namespace

HttpReply http_request(const std::string& host, int port, Verb verb, const std::string& target,
                       const std::string& body,
                       const std::vector<std::pair<std::string, std::string>>& headers,
                       std::chrono::seconds timeout) {
  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  HttpReply r;
  beast::error_code ec;
  stream.expires_after(timeout);
  const auto address = net::ip::make_address(host, ec);
  if (ec) return r;
  stream.connect(tcp::endpoint(address, static_cast<unsigned short>(port)), ec);
  if (ec) return r;
  http::request<http::string_body> req(to_beast(verb), target, 11);
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
  return to_reply(p.get());
}

HttpReply http_request(int port, Verb verb, const std::string& target, const std::string& body,
                       const std::vector<std::pair<std::string, std::string>>& headers,
                       std::chrono::seconds timeout) {
  return http_request("127.0.0.1", port, verb, target, body, headers, timeout);
}

struct RawConnection::Impl {
  net::io_context ioc;
  tcp::socket socket{ioc};
  beast::flat_buffer buf;  // bytes read past the last response
};

RawConnection::RawConnection(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RawConnection::RawConnection(RawConnection&&) noexcept = default;
RawConnection& RawConnection::operator=(RawConnection&&) noexcept = default;
RawConnection::~RawConnection() = default;

std::optional<RawConnection> RawConnection::try_connect(int port) {
  auto impl = std::make_unique<Impl>();
  beast::error_code ec;
  impl->socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)),
                       ec);
  if (ec) return std::nullopt;
  return RawConnection(std::move(impl));
}

RawConnection RawConnection::connect(int port) {
  auto impl = std::make_unique<Impl>();
  beast::error_code ec;
  impl->socket.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), static_cast<unsigned short>(port)),
                       ec);
  if (ec) throw_error(ec, "connect");
  return RawConnection(std::move(impl));
}

void RawConnection::send(const std::string& bytes) {
  beast::error_code ec;
  net::write(impl_->socket, net::buffer(bytes), ec);
  if (ec) throw_error(ec, "write");
}

HttpReply RawConnection::read_response() {
  beast::error_code ec;
  http::response<http::string_body> res;
  http::read(impl_->socket, impl_->buf, res, ec);
  if (ec) throw_error(ec, "read");
  return to_reply(res);
}

std::string RawConnection::read_some(std::size_t max, std::error_code& ec) {
  std::string got(max, '\0');
  beast::error_code bec;
  const size_t n = impl_->socket.read_some(net::buffer(got), bec);
  ec = std::error_code(bec);
  got.resize(bec ? 0 : n);
  return got;
}

std::string RawConnection::read_some(std::size_t max) {
  std::error_code ec;
  std::string got = read_some(max, ec);
  if (ec) throw std::system_error(ec, "read");
  return got;
}

void RawConnection::close() {
  beast::error_code ec;
  impl_->socket.close(ec);
}

int RawConnection::fd() const {
  return impl_->socket.native_handle();
}

std::vector<SseEvent> parse_sse(const std::string& body) {
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

double metric_value(const std::string& page, const std::string& name) {
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

int wait_for_health(int port, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int health = 0;
  while (std::chrono::steady_clock::now() < end && (health = http_get(port, "/health").status) != 200)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  return health;
}

}  // namespace beluga::server::testing
