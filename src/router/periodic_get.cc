#include "router/periodic_get.h"

#include <chrono>
#include <optional>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace beluga::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

struct Loop : std::enable_shared_from_this<Loop> {
  Loop(net::io_context& ioc, RouterContext& c, Replica& r, std::shared_ptr<std::atomic<bool>> stop,
       std::function<GetRequest()> n, std::function<int(const GetResult&)> res)
      : ctx(c),
        replica(r),
        exec(net::make_strand(ioc)),
        timer(exec),
        stopped(std::move(stop)),
        next(std::move(n)),
        on_result(std::move(res)) {}

  void run() {
    if (*stopped) return;
    spec = next();
    request = "GET " + spec.target + " HTTP/1.1\r\nHost: " + replica.address().host + ":" +
              replica.address().port + "\r\nUser-Agent: beluga-router\r\n" +
              (spec.authorize && !ctx.cfg.replica_api_key.empty()
                   ? "Authorization: Bearer " + ctx.cfg.replica_api_key + "\r\n"
                   : "") +
              "Connection: close\r\n\r\n";
    stream.emplace(exec);
    stream->expires_after(std::chrono::milliseconds(ctx.cfg.health_timeout_ms));
    stream->async_connect(ctx.endpoints[size_t(replica.id())],
                          [self = shared_from_this()](beast::error_code ec, const auto&) {
                            if (ec) return self->done({false, 0, {}, "connect: " + ec.message()});
                            self->write();
                          });
  }

  void write() {
    net::async_write(
        *stream, net::buffer(request), [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->done({false, 0, {}, "write: " + ec.message()});
          self->buffer.clear();
          self->response.emplace();
          self->response->body_limit(self->spec.body_limit);
          const int read_ms =
              self->spec.read_timeout_ms > 0 ? self->spec.read_timeout_ms : self->ctx.cfg.health_timeout_ms;
          self->stream->expires_after(std::chrono::milliseconds(read_ms));
          http::async_read(*self->stream, self->buffer, *self->response,
                           [self](beast::error_code ec, size_t) {
                             if (ec) return self->done({false, 0, {}, "read: " + ec.message()});
                             auto& res = self->response->get();
                             self->done({true, res.result_int(), std::move(res.body()), {}});
                           });
        });
  }

  void done(const GetResult& r) {
    beast::error_code ignored;
    if (stream) stream->socket().close(ignored);
    stream.reset();
    response.reset();
    if (*stopped) return;
    const int wait_ms = on_result(r);
    if (wait_ms <= 0) return run();
    timer.expires_after(std::chrono::milliseconds(wait_ms));
    timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->run();
    });
  }

  RouterContext& ctx;
  Replica& replica;
  net::strand<net::io_context::executor_type> exec;
  net::steady_timer timer;
  std::shared_ptr<std::atomic<bool>> stopped;
  std::function<GetRequest()> next;
  std::function<int(const GetResult&)> on_result;
  GetRequest spec;
  std::string request;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::string_body>> response;
};

}  // namespace

void start_periodic_get(net::io_context& ioc, RouterContext& ctx, Replica& replica,
                        std::shared_ptr<std::atomic<bool>> stopped, std::function<GetRequest()> next,
                        std::function<int(const GetResult&)> on_result) {
  auto loop =
      std::make_shared<Loop>(ioc, ctx, replica, std::move(stopped), std::move(next), std::move(on_result));
  net::dispatch(loop->exec, [loop] { loop->run(); });
}

}  // namespace beluga::router
