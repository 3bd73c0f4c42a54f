// `beluga bench router`: what the router adds. Runs, in this process, a synthetic upstream (answers
// /health, a small JSON completion, or an SSE stream of --events chat chunks as fast as it can) and
// a `beluga router` in front of it, then measures from a client on loopback:
//   - added latency: sequential non-streamed requests on a keep-alive connection, direct to the
//     upstream and through the router (p50 / p99 of each; added = router - direct);
//   - relay rate: --streams concurrent streaming requests of --events events each, direct and
//     through the router (events per second delivered to the clients).
// Both for the round-robin policy (the proxy alone) and cache-aware (the prompt rendered, tokenized
// and looked up in the prefix index on every request). Prints a table; --out writes JSON.
#include "cli/bench_router.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/model_args.h"
#include "router/router.h"
#include "util/error.h"

namespace beluga::cli {

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

constexpr const char* kEvent =
    "data: {\"id\":\"chatcmpl-bench\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"m\","
    "\"choices\":[{\"index\":0,\"delta\":{\"content\":\" tok\"},\"finish_reason\":null}]}\n\n";
constexpr const char* kCompletion =
    R"({"id":"chatcmpl-bench","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,)"
    R"("message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],)"
    R"("usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}})";

// The synthetic upstream: a thread per connection, blocking I/O (it must outpace the router).
class SyntheticUpstream {
 public:
  explicit SyntheticUpstream(int events) : events_(events), acceptor_(ioc_, tcp::endpoint(tcp::v4(), 0)) {
    event_chunk_ = chunk(kEvent);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~SyntheticUpstream() {
    stop_ = true;
    beast::error_code ec;
    acceptor_.close(ec);
    // Wake the blocked accept: connect once.
    tcp::socket s(ioc_);
    s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ec);
    if (accept_thread_.joinable()) accept_thread_.join();
    for (auto& t : conns_) t.join();
  }
  unsigned short port() const { return port_; }

 private:
  static std::string chunk(std::string_view data) {
    char hex[24];
    const int n = std::snprintf(hex, sizeof(hex), "%zx\r\n", data.size());
    return std::string(hex, size_t(n)) + std::string(data) + "\r\n";
  }

  void accept_loop() {
    for (;;) {
      tcp::socket s(ioc_);
      beast::error_code ec;
      acceptor_.accept(s, ec);
      if (stop_ || ec) return;
      s.set_option(tcp::no_delay(true), ec);
      conns_.emplace_back([this, s = std::move(s)]() mutable { serve(std::move(s)); });
    }
  }

  void serve(tcp::socket s) {
    beast::flat_buffer buf;
    beast::error_code ec;
    for (;;) {
      http::request<http::string_body> req;
      http::read(s, buf, req, ec);
      if (ec) return;
      std::string out;
      if (req.target() == "/health") {
        out =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
            "15\r\n\r\n{\"status\":\"ok\"}";
        net::write(s, net::buffer(out), ec);
      } else if (req.body().find("\"stream\":true") == std::string::npos) {
        out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " +
              std::to_string(std::strlen(kCompletion)) + "\r\n\r\n" + kCompletion;
        net::write(s, net::buffer(out), ec);
      } else {
        out = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
        net::write(s, net::buffer(out), ec);
        for (int i = 0; i < events_ && !ec; ++i)
          net::write(s, net::buffer(event_chunk_), ec);  // one write each
        if (!ec) net::write(s, net::buffer(chunk("data: [DONE]\n\n") + "0\r\n\r\n"), ec);
      }
      if (ec) return;
    }
  }

  const int events_;
  net::io_context ioc_;
  tcp::acceptor acceptor_;
  unsigned short port_ = acceptor_.local_endpoint().port();
  std::string event_chunk_;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::vector<std::thread> conns_;
};

// A keep-alive client connection (blocking).
class Client {
 public:
  explicit Client(unsigned short port) : socket_(ioc_) {
    socket_.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    socket_.set_option(tcp::no_delay(true));
  }
  // Sends one request and reads the whole response; returns the SSE events in its body.
  int request(const std::string& body) {
    http::request<http::string_body> req(http::verb::post, "/v1/chat/completions", 11);
    req.set(http::field::host, "127.0.0.1");
    req.set(http::field::content_type, "application/json");
    req.set(http::field::authorization, "Bearer bench-tenant");
    req.body() = body;
    req.prepare_payload();
    http::write(socket_, req);
    http::response<http::string_body> res;
    http::read(socket_, buf_, res);
    BELUGA_CHECK(res.result_int() == 200, "bench router: the request got ", res.result_int(), ": ",
                 res.body());
    int events = 0;
    for (size_t p = res.body().find("data: "); p != std::string::npos; p = res.body().find("data: ", p + 6))
      ++events;
    return events;
  }

 private:
  net::io_context ioc_;
  tcp::socket socket_;
  beast::flat_buffer buf_;
};

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

struct Latency {
  double p50_ms = 0, p99_ms = 0;
};

Latency measure_latency(unsigned short port, int requests, const std::string& body) {
  Client c(port);
  for (int i = 0; i < std::min(requests, 50); ++i) c.request(body);  // warm-up
  std::vector<double> ms;
  ms.reserve(size_t(requests));
  for (int i = 0; i < requests; ++i) {
    const auto t0 = Clock::now();
    c.request(body);
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  }
  return {percentile(ms, 0.5), percentile(ms, 0.99)};
}

double measure_events_per_s(unsigned short port, int streams, int rounds, int events,
                            const std::string& body) {
  std::atomic<long> total{0};
  std::atomic<bool> failed{false};
  const auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int s = 0; s < streams; ++s)
    ts.emplace_back([&] {
      try {
        Client c(port);
        for (int r = 0; r < rounds; ++r) total += c.request(body) - 1;  // not the [DONE]
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bench router: stream failed: %s\n", e.what());
        failed = true;
      }
    });
  for (auto& t : ts) t.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  BELUGA_CHECK(!failed, "bench router: a stream failed");
  BELUGA_CHECK(total == long(streams) * rounds * events, "bench router: ", total.load(), " events arrived, ",
               long(streams) * rounds * events, " expected");
  return double(total) / secs;
}

}  // namespace

int bench_router(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench router");
  const int requests = int(args.get_int("requests", 2000));
  const int events = int(args.get_int("events", 2000));
  const int streams = int(args.get_int("streams", 16));
  const int rounds = int(args.get_int("rounds", 4));
  const int io_threads = int(args.get_int("io-threads", 2));
  const auto out = args.get("out");
  std::string model_dir = args.get_or("model", "");
  args.check_all_used();
  BELUGA_CHECK(requests > 0 && events > 0 && streams > 0 && rounds > 0 && io_threads > 0,
               "--requests, --events, --streams, --rounds and --io-threads must be positive");
  if (model_dir.empty()) model_dir = default_model_dir();

  // A chat request of a few hundred prompt tokens (what the cache-aware policy renders and hashes).
  std::string text;
  for (int i = 0; i < 40; ++i)
    text += "def f" + std::to_string(i) + "(x): return x * " + std::to_string(i) + "\n";
  const std::string messages = nlohmann::json::array({{{"role", "user"}, {"content", text}}}).dump();
  const std::string plain = R"({"model":"m","max_tokens":1,"messages":)" + messages + "}";
  const std::string streamed = R"({"model":"m","stream":true,"messages":)" + messages + "}";

  SyntheticUpstream upstream(events);
  const Latency direct = measure_latency(upstream.port(), requests, plain);
  const double direct_eps = measure_events_per_s(upstream.port(), streams, rounds, events, streamed);

  nlohmann::ordered_json report{
      {"requests", requests},
      {"events_per_stream", events},
      {"streams", streams},
      {"rounds", rounds},
      {"io_threads", io_threads},
      {"direct", {{"p50_ms", direct.p50_ms}, {"p99_ms", direct.p99_ms}, {"events_per_s", direct_eps}}},
      {"router", nlohmann::ordered_json::array()}};
  std::printf(
      "bench router: %d sequential requests, %d streams x %d rounds x %d events, router io threads %d\n\n",
      requests, streams, rounds, events, io_threads);
  std::printf("%-14s %10s %10s %12s %12s %14s\n", "path", "p50 ms", "p99 ms", "added p50", "added p99",
              "SSE events/s");
  std::printf("%-14s %10.3f %10.3f %12s %12s %14.0f\n", "direct", direct.p50_ms, direct.p99_ms, "-", "-",
              direct_eps);
  for (router::Policy policy : {router::Policy::kRoundRobin, router::Policy::kCacheAware}) {
    router::RouterConfig cfg;
    cfg.port = 0;
    cfg.replicas = {"http://127.0.0.1:" + std::to_string(upstream.port())};
    cfg.policy = policy;
    cfg.io_threads = io_threads;
    cfg.log_replica_changes = false;
    router::Router r(cfg, std::make_unique<router::PromptModel>(router::PromptModel::from_dir(model_dir)));
    r.listen();
    r.start();
    const auto port = static_cast<unsigned short>(r.port());
    const Latency via = measure_latency(port, requests, plain);
    const double eps = measure_events_per_s(port, streams, rounds, events, streamed);
    r.stop();
    const double add50 = via.p50_ms - direct.p50_ms, add99 = via.p99_ms - direct.p99_ms;
    std::printf("%-14s %10.3f %10.3f %12.3f %12.3f %14.0f\n", router::policy_name(policy), via.p50_ms,
                via.p99_ms, add50, add99, eps);
    report["router"].push_back({{"policy", router::policy_name(policy)},
                                {"p50_ms", via.p50_ms},
                                {"p99_ms", via.p99_ms},
                                {"added_p50_ms", add50},
                                {"added_p99_ms", add99},
                                {"events_per_s", eps}});
  }
  std::printf("\ngoals (issue #23): added p50 <= 1 ms, >= 50000 SSE events/s\n");
  if (out) {
    std::ofstream f(*out);
    BELUGA_CHECK(f, "cannot write ", *out);
    f << report.dump(2) << "\n";
  }
  return 0;
}

}  // namespace beluga::cli
