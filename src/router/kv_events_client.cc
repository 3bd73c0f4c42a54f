#include "router/kv_events_client.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <optional>

#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "engine/kv_event_json.h"

namespace beluga::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

namespace {

constexpr size_t kMaxPageBytes = size_t(256) << 20;  // a snapshot of a few million blocks
constexpr int kPageEvents = 4096;

}  // namespace

struct KvEventsClient::Poll : std::enable_shared_from_this<KvEventsClient::Poll> {
  Poll(net::io_context& ioc, RouterContext& c, Replica& r, std::shared_ptr<std::atomic<bool>> stop)
      : ctx(c), replica(r), exec(net::make_strand(ioc)), timer(exec), stopped(std::move(stop)) {}

  void run() {
    if (*stopped) return;
    const KvIndex::Cursor cur = ctx.kv_index.cursor(replica.id());
    char epoch[17];
    std::snprintf(epoch, sizeof(epoch), "%016llx", static_cast<unsigned long long>(cur.epoch));
    request =
        "GET /v1/kv/events?epoch=" + std::string(epoch) + "&after=" + std::to_string(cur.seq) +
        "&max=" + std::to_string(kPageEvents) + " HTTP/1.1\r\nHost: " + replica.address().host + ":" +
        replica.address().port + "\r\nUser-Agent: beluga-router\r\n" +
        (ctx.cfg.replica_api_key.empty() ? "" : "Authorization: Bearer " + ctx.cfg.replica_api_key + "\r\n") +
        "Connection: close\r\n\r\n";
    stream.emplace(exec);
    stream->expires_after(std::chrono::milliseconds(ctx.cfg.health_timeout_ms));
    stream->async_connect(ctx.endpoints[size_t(replica.id())],
                          [self = shared_from_this()](beast::error_code ec, const auto&) {
                            if (ec) return self->done(false, false);
                            self->write();
                          });
  }

  void write() {
    net::async_write(
        *stream, net::buffer(request), [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->done(false, false);
          self->buffer.clear();
          self->response.emplace();
          self->response->body_limit(kMaxPageBytes);
          // A snapshot may be large: its read gets longer than a health check.
          self->stream->expires_after(std::chrono::milliseconds(self->ctx.cfg.health_timeout_ms * 10));
          http::async_read(*self->stream, self->buffer, *self->response,
                           [self](beast::error_code ec, size_t) {
                             if (ec || self->response->get().result_int() != 200)
                               return self->done(false, false);
                             auto page = parse_kv_event_page(self->response->get().body());
                             if (!page) return self->done(false, false);
                             const int id = self->replica.id();
                             self->ctx.kv_index.apply(id, *page);
                             auto& c = self->replica.counters();
                             c.kv_blocks.store(self->ctx.kv_index.blocks(id), std::memory_order_relaxed);
                             c.kv_epochs.store(self->ctx.kv_index.epochs_seen(id), std::memory_order_relaxed);
                             if (page->snapshot || !page->events.empty())
                               c.kv_pages.fetch_add(1, std::memory_order_relaxed);
                             self->done(true, page->more);
                           });
        });
  }

  void done(bool ok, bool more) {
    beast::error_code ignored;
    if (stream) stream->socket().close(ignored);
    stream.reset();
    response.reset();
    if (*stopped) return;
    if (ok && more) return run();
    // A failed read backs off 2x per failure up to 10 intervals: a replica still starting (or one
    // busy under load) is read again soon, one that is down is not polled hard.
    failures = ok ? 0 : std::min(failures + 1, 4);
    const int factor = failures == 0 ? 1 : std::min(10, 1 << (failures - 1));
    timer.expires_after(std::chrono::milliseconds(ctx.cfg.kv_events_interval_ms * factor));
    timer.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->run();
    });
  }

  RouterContext& ctx;
  Replica& replica;
  net::strand<net::io_context::executor_type> exec;
  net::steady_timer timer;
  std::shared_ptr<std::atomic<bool>> stopped;
  int failures = 0;
  std::string request;
  std::optional<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::string_body>> response;
};

KvEventsClient::KvEventsClient(net::io_context& ioc, RouterContext& ctx)
    : ioc_(ioc), ctx_(ctx), stopped_(std::make_shared<std::atomic<bool>>(false)) {}

KvEventsClient::~KvEventsClient() {
  stop();
}

void KvEventsClient::start() {
  for (auto& r : ctx_.replicas) {
    auto p = std::make_shared<Poll>(ioc_, ctx_, *r, stopped_);
    net::dispatch(p->exec, [p] { p->run(); });
  }
}

void KvEventsClient::stop() {
  *stopped_ = true;
}

}  // namespace beluga::router
