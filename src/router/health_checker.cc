#include "router/health_checker.h"

#include <chrono>
#include <optional>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

namespace beluga::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

struct HealthChecker::Probe : std::enable_shared_from_this<HealthChecker::Probe> {
  Probe(net::io_context& ioc, RouterContext& c, Replica& r, std::shared_ptr<std::atomic<bool>> stop)
      : ctx(c), replica(r), exec(net::make_strand(ioc)), timer(exec), stopped(std::move(stop)) {
    request = "GET /health HTTP/1.1\r\nHost: " + r.address().host + ":" + r.address().port +
              "\r\nUser-Agent: beluga-router\r\nConnection: close\r\n\r\n";
  }

  void run() {
    if (*stopped) return;
    stream.emplace(exec);
    stream->expires_after(std::chrono::milliseconds(ctx.cfg.health_timeout_ms));
    stream->async_connect(ctx.endpoints[size_t(replica.id())],
                          [self = shared_from_this()](beast::error_code ec, const auto&) {
                            if (ec) return self->done(false, "connect: " + ec.message());
                            self->write();
                          });
  }

  void write() {
    net::async_write(
        *stream, net::buffer(request), [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->done(false, "write: " + ec.message());
          self->buffer.clear();
          self->response.emplace();
          self->response->body_limit(65536);
          http::async_read(*self->stream, self->buffer, *self->response,
                           [self](beast::error_code ec, size_t) {
                             if (ec) return self->done(false, "read: " + ec.message());
                             const unsigned status = self->response->get().result_int();
                             if (status == 200 && self->replica.role() == ReplicaRole::kDecode)
                               self->learn_kv_address(self->response->get().body());
                             self->done(status == 200, "GET /health answered " + std::to_string(status));
                           });
        });
  }

  // A decode engine's /health names where its KV transfers arrive; a wildcard host is reached at
  // the engine's own host.
  void learn_kv_address(const std::string& body) {
    const auto j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object() || !j.contains("kv_listen") || !j["kv_listen"].is_string())
      return replica.set_kv_address("");
    std::string a = j["kv_listen"].get<std::string>();
    for (const char* any : {"0.0.0.0:", "[::]:"})
      if (a.starts_with(any)) a = replica.address().host + a.substr(std::string_view(any).size() - 1);
    replica.set_kv_address(std::move(a));
    replica.kv_usage.store(
        j.contains("kv_usage") && j["kv_usage"].is_number() ? j["kv_usage"].get<double>() : 0.0,
        std::memory_order_relaxed);
  }

  void done(bool ok, const std::string& why) {
    beast::error_code ignored;
    if (stream) stream->socket().close(ignored);
    stream.reset();
    if (ok) {
      if (replica.breaker().on_success()) ctx.on_rejoined(replica);
    } else {
      if (replica.breaker().on_failure()) ctx.on_ejected(replica, "health check: " + why);
    }
    if (*stopped) return;
    timer.expires_after(std::chrono::milliseconds(ctx.cfg.health_interval_ms));
    timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->run();
    });
  }

  RouterContext& ctx;
  Replica& replica;
  net::strand<net::io_context::executor_type> exec;
  net::steady_timer timer;
  std::shared_ptr<std::atomic<bool>> stopped;
  std::string request;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::string_body>> response;
};

HealthChecker::HealthChecker(net::io_context& ioc, RouterContext& ctx)
    : ioc_(ioc), ctx_(ctx), stopped_(std::make_shared<std::atomic<bool>>(false)) {}

HealthChecker::~HealthChecker() {
  stop();
}

void HealthChecker::start() {
  for (auto& r : ctx_.replicas) {
    auto p = std::make_shared<Probe>(ioc_, ctx_, *r, stopped_);
    net::dispatch(p->exec, [p] { p->run(); });
  }
}

void HealthChecker::stop() {
  *stopped_ = true;
}

}  // namespace beluga::router
