#include "router/router.h"

#include <csignal>
#include <thread>
#include <vector>

#include "router/health_checker.h"
#include "router/kv_events_client.h"
#include "router/proxy_session.h"
#include "router/router_context.h"
#include "util/error.h"
#include "util/log.h"

namespace beluga::router {

namespace net = boost::asio;
using tcp = net::ip::tcp;

void RouterContext::on_ejected(Replica& r, const std::string& why) {
  index.forget(r.id());
  kv_index.reset(r.id());
  r.drop_idle();
  if (cfg.log_replica_changes) log::warn("router", "replica ", r.address().url, " ejected (", why, ")");
}

void RouterContext::on_rejoined(Replica& r) {
  if (cfg.log_replica_changes) log::info("router", "replica ", r.address().url, " is back (half-open)");
}

// Destroyed bottom up: the tokenize pool and the io_context (whose pending handlers own sessions
// that touch the context) go before the context.
struct Router::State {
  explicit State(RouterConfig cfg, std::unique_ptr<PromptModel> model)
      : ctx(std::move(cfg), std::move(model)), tokenize_pool(size_t(std::max(1, ctx.cfg.tokenize_threads))) {}
  RouterContext ctx;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::thread_pool tokenize_pool;
  HealthChecker health{ioc, ctx};
  KvEventsClient kv_events{ioc, ctx};
  std::vector<std::thread> threads;
};

namespace {

void do_accept(Router::State* st) {
  st->acceptor.async_accept(
      net::make_strand(st->ioc), [st](boost::system::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || !st->acceptor.is_open()) return;
        if (ec) {
          // Out of descriptors or the like: pause instead of spinning on the error.
          log::error("router", "accept failed: ", ec.message());
          auto t = std::make_shared<net::steady_timer>(st->ioc, std::chrono::milliseconds(100));
          t->async_wait([st, t](boost::system::error_code) { do_accept(st); });
          return;
        }
        boost::system::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        start_proxy_session(std::move(socket), st->ctx);
        do_accept(st);
      });
}

}  // namespace

Router::Router(RouterConfig cfg, std::unique_ptr<PromptModel> model)
    : st_(std::make_unique<State>(std::move(cfg), std::move(model))) {
  RouterContext& ctx = st_->ctx;
  BELUGA_CHECK(!ctx.disaggregated || (!ctx.cfg.prefill.empty() && !ctx.cfg.decode.empty()),
               "disaggregated serving needs at least one --prefill and one --decode URL");
  BELUGA_CHECK(!ctx.disaggregated || (ctx.cfg.replicas.empty() && ctx.cfg.buckets.empty()),
               "--replica and --bucket do not combine with --prefill/--decode (give each engine its role)");
  ctx.tokenize_pool = &st_->tokenize_pool;
  tcp::resolver resolver(st_->ioc);
  // The buckets' replicas are replicas too (each once, however many buckets name it).
  std::vector<std::string> urls = ctx.cfg.replicas;
  for (const auto& b : ctx.cfg.buckets)
    for (const auto& u : b.urls) {
      const std::string norm = parse_replica_url(u).url;
      bool known = false;
      for (const auto& v : urls) known = known || parse_replica_url(v).url == norm;
      if (!known) urls.push_back(u);
    }
  BELUGA_CHECK(!urls.empty() || ctx.disaggregated, "at least one --replica URL is needed");
  BELUGA_CHECK(urls.size() + ctx.cfg.prefill.size() + ctx.cfg.decode.size() <= size_t(kMaxReplicas),
               "at most ", kMaxReplicas, " replicas");
  const std::pair<const std::vector<std::string>*, ReplicaRole> lists[] = {
      {&urls, ReplicaRole::kBoth},
      {&ctx.cfg.prefill, ReplicaRole::kPrefill},
      {&ctx.cfg.decode, ReplicaRole::kDecode}};
  for (const auto& [list, role] : lists) {
    const char* flag = role == ReplicaRole::kBoth      ? "--replica "
                       : role == ReplicaRole::kPrefill ? "--prefill "
                                                       : "--decode ";
    for (const auto& url : *list) {
      ReplicaAddress a = parse_replica_url(url);
      boost::system::error_code ec;
      auto results = resolver.resolve(a.host, a.port, ec);
      BELUGA_CHECK(!ec && !results.empty(), flag, url, ": cannot resolve ", a.host, ": ", ec.message());
      std::vector<tcp::endpoint> eps;
      for (const auto& e : results) eps.push_back(e.endpoint());
      for (const auto& r : ctx.replicas)
        BELUGA_CHECK(r->address().url != a.url, flag, url, " is given twice");
      ctx.endpoints.push_back(std::move(eps));
      ctx.replicas.push_back(
          std::make_unique<Replica>(int(ctx.replicas.size()), std::move(a), ctx.cfg.eject_after, role));
    }
  }
  for (const auto& b : ctx.cfg.buckets) {
    uint64_t members = 0;
    for (const auto& u : b.urls) {
      const std::string norm = parse_replica_url(u).url;
      for (const auto& r : ctx.replicas)
        if (r->address().url == norm) members |= uint64_t(1) << r->id();
    }
    ctx.buckets.add(b.name, b.max_tokens, members);
  }
}

Router::~Router() {
  stop();
}

void Router::listen() {
  const RouterConfig& cfg = st_->ctx.cfg;
  boost::system::error_code ec;
  auto addr = net::ip::make_address(cfg.host, ec);
  if (ec) {
    tcp::resolver resolver(st_->ioc);
    auto results = resolver.resolve(cfg.host, std::to_string(cfg.port), ec);
    BELUGA_CHECK(!ec && !results.empty(), "cannot resolve --host ", cfg.host, ": ", ec.message());
    addr = results.begin()->endpoint().address();
  }
  tcp::endpoint ep(addr, static_cast<unsigned short>(cfg.port));
  st_->acceptor.open(ep.protocol(), ec);
  BELUGA_CHECK(!ec, "cannot open a socket: ", ec.message());
  st_->acceptor.set_option(net::socket_base::reuse_address(true), ec);
  st_->acceptor.bind(ep, ec);
  BELUGA_CHECK(!ec, "cannot listen on ", cfg.host, ":", cfg.port, ": ", ec.message());
  st_->acceptor.listen(net::socket_base::max_listen_connections, ec);
  BELUGA_CHECK(!ec, "cannot listen on ", cfg.host, ":", cfg.port, ": ", ec.message());
  do_accept(st_.get());
}

int Router::port() const {
  boost::system::error_code ec;
  auto ep = st_->acceptor.local_endpoint(ec);
  return ec ? -1 : ep.port();
}

size_t Router::num_replicas() const {
  return st_->ctx.replicas.size();
}

void Router::start() {
  st_->health.start();
  st_->kv_events.start();
  const int n = std::max(1, st_->ctx.cfg.io_threads);
  for (int i = 0; i < n; ++i)
    st_->threads.emplace_back([st = st_.get()] {
      for (;;) {
        try {
          st->ioc.run();
          return;
        } catch (const std::exception& e) {
          log::error("router", "I/O thread error: ", e.what());
        }
      }
    });
}

void Router::wait_for_signal() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
}

void Router::stop() {
  st_->health.stop();
  st_->kv_events.stop();
  net::post(st_->ioc, [st = st_.get()] {
    boost::system::error_code ec;
    st->acceptor.close(ec);
  });
  st_->ioc.stop();
  for (auto& t : st_->threads)
    if (t.joinable()) t.join();
  st_->threads.clear();
  st_->tokenize_pool.stop();
  st_->tokenize_pool.join();
}

}  // namespace beluga::router
