#include "server/server.h"

#include <algorithm>
#include <array>
#include <csignal>

#include "server/server_state.h"
#include "server/session.h"
#include "util/error.h"
#include "util/log.h"

namespace beluga::server {

namespace net = boost::asio;
namespace beast = boost::beast;
using tcp = net::ip::tcp;

namespace {

// Handlers hold a plain pointer: the State owns the io_context that stores them, so a shared_ptr here
// would keep the State alive forever (a leak). Server::stop() joins the I/O threads before the State
// goes away, and no handler runs after that.
// A connection past max_connections: a 503 in the OpenAI error shape (the path is not read, so the
// API is not known), then a half-close and a short read of whatever the client sent, so the client
// reads the 503 rather than a reset. Bounded: 5 s and 64 KiB at most.
struct Rejected {
  explicit Rejected(tcp::socket s) : stream(std::move(s)) {}
  beast::tcp_stream stream;
  std::string reply;
  std::array<char, 4096> sink{};
  size_t drained = 0;
};

void drain_rejected(const std::shared_ptr<Rejected>& r) {
  r->stream.async_read_some(net::buffer(r->sink), [r](beast::error_code ec, size_t n) {
    r->drained += n;
    if (!ec && r->drained <= 65536) drain_rejected(r);
  });
}

void reject_connection(tcp::socket socket, Server::State& st) {
  recipe::ApiError e(recipe::Api::kChat, 503,
                     "the server is at its connection limit (" + std::to_string(st.cfg.max_connections) +
                         " open connections); retry later");
  const std::string body = e.body().dump();
  auto r = std::make_shared<Rejected>(std::move(socket));
  r->reply =
      "HTTP/1.1 503 Service Unavailable\r\nServer: beluga\r\nContent-Type: application/json\r\n"
      "Retry-After: 1\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  r->stream.expires_after(std::chrono::seconds(5));
  st.metrics.connection_rejected();
  net::async_write(r->stream, net::buffer(r->reply), [r](beast::error_code ec, size_t) {
    if (ec) return;
    r->stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    drain_rejected(r);
  });
}

void do_accept(Server::State* st) {
  st->acceptor.async_accept(net::make_strand(st->ioc), [st](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !st->acceptor.is_open()) return;
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      if (st->connections.load() >= st->cfg.max_connections)
        reject_connection(std::move(socket), *st);
      else
        std::make_shared<Session>(std::move(socket), *st)->run();
    } else {
      // Out of descriptors (EMFILE) or the like: pause instead of spinning on the error.
      log::error("serve", "accept failed: ", ec.message());
      auto t = std::make_shared<net::steady_timer>(st->ioc, std::chrono::milliseconds(100));
      t->async_wait([st, t](beast::error_code) { do_accept(st); });
      return;
    }
    do_accept(st);
  });
}

}  // namespace

Server::Server(ServerConfig cfg) : st_(std::make_shared<State>()) {
  st_->cfg = std::move(cfg);
  st_->responses = std::make_unique<ResponseStore>(st_->cfg.max_stored_responses);
  st_->builds = std::make_unique<BuildPool>(st_->cfg.build_threads, st_->cfg.build_queue);
  st_->health = std::make_unique<EngineHealth>(std::chrono::seconds(st_->cfg.engine_stall_s));
}

Server::~Server() {
  stop();
}

void Server::listen() {
  beast::error_code ec;
  auto addr = net::ip::make_address(st_->cfg.host, ec);
  if (ec) {
    // A host name: resolve it.
    tcp::resolver resolver(st_->ioc);
    auto results = resolver.resolve(st_->cfg.host, std::to_string(st_->cfg.port), ec);
    BELUGA_CHECK(!ec && !results.empty(), "cannot resolve --host ", st_->cfg.host, ": ", ec.message());
    addr = results.begin()->endpoint().address();
  }
  tcp::endpoint ep(addr, static_cast<unsigned short>(st_->cfg.port));
  st_->acceptor.open(ep.protocol(), ec);
  BELUGA_CHECK(!ec, "cannot open a socket: ", ec.message());
  st_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  st_->acceptor.bind(ep, ec);
  BELUGA_CHECK(!ec, "cannot listen on ", st_->cfg.host, ":", st_->cfg.port, ": ", ec.message());
  st_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  BELUGA_CHECK(!ec, "cannot listen on ", st_->cfg.host, ":", st_->cfg.port, ": ", ec.message());
  do_accept(st_.get());
}

int Server::port() const {
  beast::error_code ec;
  auto ep = st_->acceptor.local_endpoint(ec);
  return ec ? -1 : ep.port();
}

void Server::set_engine(EngineHandle* engine, ModelInfo info) {
  // Handlers read these only after seeing ready == true (release/acquire through the atomic).
  st_->engine = engine;
  st_->info = std::move(info);
  if (st_->info.pd.transfer) st_->transfers = std::make_unique<boost::asio::thread_pool>(2);
  st_->ready.store(true);
  st_->engine_verdict();  // the first sample: the baseline of "recent steps"
}

void Server::start() {
  const int n = std::max(1, st_->cfg.io_threads);
  for (int i = 0; i < n; ++i)
    st_->threads.emplace_back([st = st_] {
      for (;;) {
        try {
          st->ioc.run();
          return;
        } catch (const std::exception& e) {
          log::error("serve", "I/O thread error: ", e.what());
        }
      }
    });
}

void Server::block_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

void Server::wait_for_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  // Wait in a helper thread for the signals (blocked in every thread), or for stop().
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread waiter([this, set] {
    int sig = 0;
    sigwait(&set, &sig);
    std::lock_guard lock(st_->mu);
    st_->stopping = true;
    st_->cv.notify_all();
  });
  {
    std::unique_lock lock(st_->mu);
    st_->cv.wait(lock, [&] { return st_->stopping; });
  }
  // Wake the waiter if stop() (not a signal) ended the wait.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
}

bool Server::drain(std::chrono::seconds grace) {
  State& st = *st_;
  st.drain.begin();
  net::post(st.ioc, [&st] {
    beast::error_code ec;
    st.acceptor.close(ec);
  });
  return st.drain.finish(grace);
}

void Server::stop() {
  st_->builds->stop();                         // its tasks post to the I/O threads: it stops first
  if (st_->transfers) st_->transfers->join();  // the transfers in progress end (their timeouts bound it)
  {
    std::lock_guard lock(st_->mu);
    st_->stopping = true;
    st_->cv.notify_all();
  }
  net::post(st_->ioc, [st = st_.get()] {
    beast::error_code ec;
    st->acceptor.close(ec);
  });
  st_->ioc.stop();
  for (auto& t : st_->threads)
    if (t.joinable()) t.join();
  st_->threads.clear();
}

Metrics& Server::metrics() {
  return st_->metrics;
}

}  // namespace beluga::server
