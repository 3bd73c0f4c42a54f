// Fault and load tests against a real `beluga serve` process on the built-in demo model (CPU, one
// thread, loopback): clients that disconnect at random points leave no KV blocks in use and no
// requests in flight; /health answers while hundreds of slow-header connections are held, and the
// header timeout drops them; oversize fan-out is a 400; failing engine steps fail their requests and
// the server serves on; SIGTERM drains streams up to the grace period, cuts the rest short cleanly,
// and the process exits 0. Figures are printed as "[figures] ..." lines (docs/reliability.md).
#include <gtest/gtest.h>

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../common/http_client.h"
#include "../common/serve_process.h"

namespace {

using Json = nlohmann::json;
using beluga::server::testing::HttpReply;
using beluga::server::testing::metric_value;
using beluga::testing::ChildProcess;
using beluga::testing::Clock;
using beluga::testing::seconds_since;

// `beluga serve` on the demo model with `extra` flags and `env` ("NAME=VALUE") in its environment.
ChildProcess serve(const std::vector<std::string>& extra, std::vector<std::string> env = {}) {
  beluga::testing::ChildOptions options;
  options.env = std::move(env);
  return beluga::testing::beluga_serve(beluga::testing::serve_flags(beluga::testing::demo_model(), 64, extra),
                                       options);
}

// A blocking loopback socket with receive / send timeouts; -1 when the connection fails.
int connect_to(int port, int timeout_s = 30) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool send_all(int fd, std::string_view s) {
  while (!s.empty()) {
    const ssize_t n = send(fd, s.data(), s.size(), MSG_NOSIGNAL);
    if (n <= 0) return false;
    s.remove_prefix(size_t(n));
  }
  return true;
}

// Reads until the peer closes (or `max` bytes, or the socket's timeout).
std::string read_all(int fd, size_t max = size_t(64) << 20) {
  std::string out;
  char buf[16384];
  while (out.size() < max) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

std::string http_post_text(const std::string& path, const std::string& body) {
  return "POST " + path +
         " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n" +
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

HttpReply get(int port, const std::string& path, int timeout_s = 30) {
  return beluga::server::testing::http_get(port, path, std::chrono::seconds(timeout_s));
}
HttpReply post(int port, const std::string& path, const Json& body, int timeout_s = 60) {
  return beluga::server::testing::http_request(port, beluga::server::testing::Verb::post, path, body.dump(),
                                               {}, std::chrono::seconds(timeout_s));
}

// Waits up to `limit` for the engine and the server to hold nothing: no KV blocks in use, no
// requests running, waiting or in flight. Returns the last /metrics page.
std::string wait_idle(int port, std::chrono::seconds limit) {
  const auto t0 = Clock::now();
  std::string page;
  while (seconds_since(t0) < double(limit.count())) {
    page = get(port, "/metrics").body;
    if (metric_value(page, "beluga_kv_blocks_used") == 0 &&
        metric_value(page, "beluga_requests_in_flight") == 0 &&
        metric_value(page, "beluga_num_requests_running") == 0 &&
        metric_value(page, "beluga_num_requests_waiting") == 0)
      return page;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return page;
}

Json completion_body(int max_tokens, bool stream) {
  return Json{
      {"prompt", "def fibonacci(n):"}, {"max_tokens", max_tokens}, {"stream", stream}, {"ignore_eos", true}};
}
Json chat_body(int max_tokens, bool stream) {
  return Json{{"messages", Json::array({Json{{"role", "user"}, {"content", "Write a sort in C."}}})},
              {"max_tokens", max_tokens},
              {"stream", stream},
              {"ignore_eos", true}};
}

// 1,000 streaming requests whose clients go away at random points: before sending anything, mid-headers,
// mid-body, right after the request, after part of the stream (some with a TCP reset), and some that
// read their stream to the end. Afterwards: zero KV blocks in use, zero requests in flight, every
// complete read got its whole stream, and the server still serves.
TEST(Fault, ThousandRandomDisconnectsLeaveNothingBehind) {
  auto srv = serve({});
  ASSERT_GT(srv.port(), 0) << srv.log();
  const int port = srv.port();
  constexpr int kRequests = 1000, kClients = 16;
  const uint32_t seed = 20261201;
  std::atomic<int> next{0}, full_ok{0}, full_bad{0}, kinds[7] = {};
  auto client = [&](int c) {
    std::mt19937 rng(seed + uint32_t(c));
    for (int i = next++; i < kRequests; i = next++) {
      const int kind = int(rng() % 7);
      ++kinds[kind];
      const bool chat = rng() % 2;
      // Abandoned requests ask for 1,500 tokens: left running, they would keep the engine busy for
      // minutes, so the idle check below fails unless disconnects abort them. Complete reads ask for few.
      const int max_tokens = kind == 6 ? 8 + int(rng() % 24) : 1500;
      const std::string raw =
          http_post_text(chat ? "/v1/chat/completions" : "/v1/completions",
                         (chat ? chat_body(max_tokens, true) : completion_body(max_tokens, true)).dump());
      const int fd = connect_to(port);
      if (fd < 0) {
        ++full_bad;
        continue;
      }
      const size_t head_end = raw.find("\r\n\r\n") + 4;
      switch (kind) {
        case 0:  // connect, then leave
          break;
        case 1:  // part of the headers
          send_all(fd, raw.substr(0, 1 + rng() % (head_end - 1)));
          break;
        case 2:  // the headers and part of the body
          send_all(fd, raw.substr(0, head_end + rng() % (raw.size() - head_end)));
          break;
        case 3:  // the whole request, then leave at once
          send_all(fd, raw);
          break;
        case 4:
        case 5: {  // part of the stream (5: then a reset instead of a close)
          send_all(fd, raw);
          const size_t want = 1 + rng() % 3000;
          std::string got;
          char buf[512];
          while (got.size() < want) {
            const ssize_t n = recv(fd, buf, std::min(sizeof(buf), want - got.size()), 0);
            if (n <= 0) break;
            got.append(buf, size_t(n));
          }
          if (kind == 5) {
            linger lg{1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
          }
          break;
        }
        default: {  // the whole stream: it must be complete
          send_all(fd, raw);
          const std::string s = read_all(fd);
          const bool ok = s.rfind("HTTP/1.1 200", 0) == 0 && s.find("data: [DONE]") != std::string::npos &&
                          s.size() >= 5 && s.compare(s.size() - 5, 5, "0\r\n\r\n") == 0;
          ++(ok ? full_ok : full_bad);
          break;
        }
      }
      close(fd);
    }
  };
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) threads.emplace_back(client, c);
  for (auto& t : threads) t.join();
  const double load_s = seconds_since(t0);
  // Generous: disconnects are seen at once; hundreds of 1,500-token requests would need minutes.
  const std::string page = wait_idle(port, std::chrono::seconds(20));
  ASSERT_TRUE(srv.alive()) << srv.log();
  EXPECT_EQ(metric_value(page, "beluga_kv_blocks_used"), 0) << page;
  EXPECT_EQ(metric_value(page, "beluga_requests_in_flight"), 0) << page;
  EXPECT_EQ(metric_value(page, "beluga_num_requests_running"), 0);
  EXPECT_EQ(metric_value(page, "beluga_num_requests_waiting"), 0);
  EXPECT_EQ(full_bad.load(), 0);
  EXPECT_EQ(full_ok.load(), kinds[6].load());
  const double disconnects = metric_value(page, "beluga_client_disconnects_total");
  EXPECT_GT(disconnects, 0);
  // Still serving.
  auto r = post(port, "/v1/completions", completion_body(8, false));
  EXPECT_EQ(r.status, 200) << r.body;
  std::printf(
      "[figures] random disconnects: %d requests (%d connect-only, %d mid-headers, %d mid-body, %d after the "
      "request, %d mid-stream, %d mid-stream reset, %d read in full: %d complete), %d clients, %.1f s; "
      "server-counted disconnects of running requests %.0f; KV blocks in use after: %.0f; requests in "
      "flight after: %.0f; seed %u\n",
      kRequests, kinds[0].load(), kinds[1].load(), kinds[2].load(), kinds[3].load(), kinds[4].load(),
      kinds[5].load(), kinds[6].load(), full_ok.load(), kClients, load_s, disconnects,
      metric_value(page, "beluga_kv_blocks_used"), metric_value(page, "beluga_requests_in_flight"), seed);
}

// 300 connections that send their headers a byte at a time: /health still answers on a new
// connection, and the header timeout closes every one of them although each keeps sending.
TEST(Fault, SlowHeaderConnectionsDoNotStarveHealthAndAreDropped) {
  constexpr int kSlow = 300, kHeaderTimeout = 3;
  auto srv = serve({"--header-timeout-s", std::to_string(kHeaderTimeout)});
  ASSERT_GT(srv.port(), 0) << srv.log();
  const int port = srv.port();
  std::vector<int> fds;
  for (int i = 0; i < kSlow; ++i) {
    const int fd = connect_to(port, 5);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(send_all(fd, "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: "));
    fds.push_back(fd);
  }
  const auto t0 = Clock::now();
  std::vector<double> closed_at(kSlow, -1);
  double health_max = 0;
  int health_ok = 0, health_probes = 0, open = kSlow;
  while (open > 0 && seconds_since(t0) < 30) {
    // Each open connection sends one more byte of its never-ending header.
    for (int i = 0; i < kSlow; ++i) {
      if (closed_at[size_t(i)] >= 0) continue;
      char c;
      const ssize_t n = recv(fds[size_t(i)], &c, 1, MSG_DONTWAIT);
      const bool gone = n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) ||
                        send(fds[size_t(i)], "a", 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0;
      if (gone) {
        closed_at[size_t(i)] = seconds_since(t0);
        --open;
      }
    }
    if (seconds_since(t0) < kHeaderTimeout - 0.5) {  // while all of them are held
      const auto h0 = Clock::now();
      const HttpReply h = get(port, "/health", /*timeout_s=*/10);
      health_max = std::max(health_max, seconds_since(h0));
      ++health_probes;
      if (h.status == 200) ++health_ok;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (int fd : fds) close(fd);
  EXPECT_EQ(open, 0) << "connections still open 30 s after their headers began";
  EXPECT_GT(health_probes, 0);
  EXPECT_EQ(health_ok, health_probes);
  double first = 1e9, last = 0;
  for (double t : closed_at)
    if (t >= 0) first = std::min(first, t), last = std::max(last, t);
  EXPECT_GE(first, kHeaderTimeout - 1.0);  // held until the timeout, not refused
  EXPECT_TRUE(srv.alive());
  EXPECT_EQ(get(port, "/health").status, 200);
  std::printf(
      "[figures] slow headers: %d connections dripping a header byte every 200 ms; /health %d/%d answered "
      "200, slowest %.3f s (limit 10 s); header timeout %d s: all dropped between %.2f and %.2f s\n",
      kSlow, health_ok, health_probes, health_max, kHeaderTimeout, first, last);
}

TEST(Fault, OversizeFanOutIsA400AndFailingStepsFailOnlyTheirRequests) {
  // Engine steps 20..29 fail.
  auto srv = serve({}, {"BELUGA_TEST_FAIL_STEPS=20:10"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  const int port = srv.port();
  Json prompts = Json::array();
  for (int i = 0; i < 64; ++i) prompts.push_back(std::to_string(i));
  // 64 prompts x n=2 = 128 sequences, past the default limit (--max-num-seqs, 64).
  HttpReply r = post(port, "/v1/completions", Json{{"prompt", prompts}, {"n", 2}, {"max_tokens", 4}});
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_NE(r.body.find("the limit is 64 sequences per request"), std::string::npos) << r.body;
  // Steps 0..19 succeed: a 12-token request (one prefill step + 11 decodes).
  r = post(port, "/v1/completions", completion_body(12, false));
  EXPECT_EQ(r.status, 200) << r.body;
  // This one runs into the failing steps: it fails, as a 500 (non-stream) ...
  r = post(port, "/v1/completions", completion_body(30, false));
  EXPECT_EQ(r.status, 500) << r.body;
  // ... and a stream that meets them ends with the API's error event.
  const HttpReply s = post(port, "/v1/chat/completions", chat_body(30, true));
  EXPECT_EQ(s.status, 200);
  EXPECT_NE(s.body.find("\"error\""), std::string::npos) << s.body;
  // Steps 30 on succeed again (the stream above may have ended before step 30: retry until then).
  int ok = 0;
  for (int i = 0; i < 20 && ok == 0; ++i)
    ok = post(port, "/v1/completions", completion_body(8, false)).status == 200;
  EXPECT_EQ(ok, 1);
  EXPECT_TRUE(srv.alive());
  const std::string page = wait_idle(port, std::chrono::seconds(30));
  EXPECT_EQ(metric_value(page, "beluga_kv_blocks_used"), 0) << page;
}

using beluga::server::testing::wait_for_health;

// `--expert-parallel-size 2` with rank 1 failing from its 6th step (BELUGA_TEST_FAIL_RANK): the request
// that meets the failure gets a 503 naming the rank, the instance restarts itself over the one
// rank left on the same port (/health back to 200, /metrics: 1 rank, 1 restart), and the same
// greedy request as before the failure gives the same completion.
TEST(Fault, AFailedExpertParallelRankRestartsTheInstanceOverTheRanksLeft) {
  auto srv = serve({"--expert-parallel-size", "2"}, {"BELUGA_TEST_FAIL_RANK=1:6"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  const int port = srv.port();
  EXPECT_EQ(metric_value(get(port, "/metrics").body, "beluga_expert_parallel_ranks"), 2);
  Json greedy = completion_body(3, false);
  greedy["temperature"] = 0;
  // Steps 1..3 (a prefill and two decode steps) on both ranks.
  const HttpReply before = post(port, "/v1/completions", greedy);
  ASSERT_EQ(before.status, 200) << before.body;
  // This one meets the failure: a 503 (the instance's failure, which a router retries elsewhere).
  const HttpReply hit = post(port, "/v1/completions", completion_body(30, false));
  EXPECT_EQ(hit.status, 503) << hit.body;
  EXPECT_EQ(hit.retry_after, "1");
  EXPECT_NE(hit.body.find("expert-parallel rank 1 failed"), std::string::npos) << hit.body;
  // Restarted over one rank (down while it reloads: 503 with the cause, or already back).
  ASSERT_EQ(wait_for_health(port, 60), 200) << srv.log();
  const std::string page = get(port, "/metrics").body;
  EXPECT_EQ(metric_value(page, "beluga_expert_parallel_ranks"), 1) << page;
  EXPECT_EQ(metric_value(page, "beluga_engine_restarts_total"), 1) << page;
  // The counters continue: the first engine's finished request(s) (the new one has served none yet).
  EXPECT_GE(metric_value(page, "beluga_engine_requests_finished_total"), 1) << page;
  const HttpReply after = post(port, "/v1/completions", greedy);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(Json::parse(after.body)["choices"][0]["text"], Json::parse(before.body)["choices"][0]["text"]);
  EXPECT_TRUE(srv.alive());
  const std::string log = srv.log();
  EXPECT_NE(log.find("expert-parallel rank 1 of 2 failed (injected failure of rank 1 at its step 6); "
                     "restarting over 1 rank"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("serving again over 1 expert-parallel rank (restart 1"), std::string::npos) << log;
}

// Attention data parallel over three ranks (each its own KV cache): rank 2 fails, and the instance
// restarts over the two ranks that still split the experts, each again with a cache of its own (the
// KV blocks in all go from 3 to 2 caches' worth) and the same greedy text as before.
TEST(Fault, AFailedDataParallelRankRestartsOverTheRanksLeftWithACacheEach) {
  auto srv = serve({"--data-parallel-size", "3"}, {"BELUGA_TEST_FAIL_RANK=2:6"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  const int port = srv.port();
  const std::string first = get(port, "/metrics").body;
  EXPECT_EQ(metric_value(first, "beluga_expert_parallel_ranks"), 3);
  const auto ranks_shown = [](const std::string& page) {
    int n = 0;
    for (size_t at = 0; (at = page.find("\nbeluga_kv_blocks_used_by_rank{", at)) != std::string::npos; ++at)
      ++n;
    return n;
  };
  EXPECT_EQ(ranks_shown(first), 3) << first;
  const double blocks = metric_value(first, "beluga_kv_blocks_total");
  EXPECT_GT(blocks, 0) << first;
  Json greedy = completion_body(3, false);
  greedy["temperature"] = 0;
  const HttpReply before = post(port, "/v1/completions", greedy);
  ASSERT_EQ(before.status, 200) << before.body;
  const HttpReply hit = post(port, "/v1/completions", completion_body(30, false));
  EXPECT_EQ(hit.status, 503) << hit.body;
  EXPECT_NE(hit.body.find("expert-parallel rank 2 failed"), std::string::npos) << hit.body;
  ASSERT_EQ(wait_for_health(port, 60), 200) << srv.log();
  const std::string page = get(port, "/metrics").body;
  EXPECT_EQ(metric_value(page, "beluga_expert_parallel_ranks"), 2) << page;
  EXPECT_EQ(metric_value(page, "beluga_kv_blocks_total"), blocks * 2 / 3) << page;
  EXPECT_EQ(ranks_shown(page), 2) << page;
  const HttpReply after = post(port, "/v1/completions", greedy);
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(Json::parse(after.body)["choices"][0]["text"], Json::parse(before.body)["choices"][0]["text"]);
  EXPECT_NE(srv.log().find("restarting over 2 ranks"), std::string::npos) << srv.log();
}

// SIGTERM with streams in flight: they finish (within the grace period), then the process exits 0.
TEST(Fault, SigtermDrainsStreamsThenExitsZero) {
  auto srv = serve({"--shutdown-grace-s", "30"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  const int port = srv.port();
  constexpr int kStreams = 4;
  std::vector<std::string> bodies(kStreams);
  std::vector<std::thread> ts;
  std::atomic<int> started{0};
  for (int i = 0; i < kStreams; ++i)
    ts.emplace_back([&, i] {
      const int fd = connect_to(port, 60);
      if (fd < 0) return;
      send_all(fd, http_post_text("/v1/completions", completion_body(200, true).dump()));
      char buf[4096];
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);  // the head and the first events
      if (n > 0) bodies[size_t(i)].assign(buf, size_t(n));
      ++started;
      bodies[size_t(i)] += read_all(fd);
      close(fd);
    });
  while (started < kStreams) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(srv.pid(), SIGTERM), 0);
  const int rc = srv.wait_exit(std::chrono::seconds(60));
  const double drain_s = seconds_since(t0);
  for (auto& t : ts) t.join();
  EXPECT_EQ(rc, 0) << srv.log();
  int complete = 0;
  for (const auto& b : bodies) {
    const bool ok = b.find("\"finish_reason\":\"length\"") != std::string::npos &&
                    b.find("data: [DONE]") != std::string::npos && b.find("\"error\"") == std::string::npos;
    complete += ok;
    if (!ok)
      ADD_FAILURE() << "incomplete stream (" << b.size()
                    << " bytes), its end: " << b.substr(b.size() - std::min<size_t>(b.size(), 600));
  }
  EXPECT_EQ(complete, kStreams);
  EXPECT_NE(srv.log().find("every request finished"), std::string::npos) << srv.log();
  std::printf("[figures] SIGTERM drain: %d/%d streams of 200 tokens completed, exit code %d after %.2f s\n",
              complete, kStreams, rc, drain_s);
}

// SIGTERM with a stream that outlasts the grace period: it is ended with the API's error event and a
// proper end of stream, and the process still exits 0.
TEST(Fault, SigtermCutsStreamsPastTheGracePeriodCleanly) {
  auto srv = serve({"--shutdown-grace-s", "1"});
  ASSERT_GT(srv.port(), 0) << srv.log();
  const int port = srv.port();
  std::string body;
  std::atomic<bool> started{false};
  std::thread t([&] {
    const int fd = connect_to(port, 60);
    if (fd < 0) return;
    send_all(fd, http_post_text("/v1/chat/completions", chat_body(2000, true).dump()));
    char buf[4096];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n > 0) body.assign(buf, size_t(n));
    started = true;
    body += read_all(fd);
    close(fd);
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const auto t0 = Clock::now();
  ASSERT_EQ(kill(srv.pid(), SIGTERM), 0);
  const int rc = srv.wait_exit(std::chrono::seconds(30));
  const double exit_s = seconds_since(t0);
  t.join();
  EXPECT_EQ(rc, 0) << srv.log();
  EXPECT_NE(body.find("shutting down"), std::string::npos)
      << body.substr(body.size() > 400 ? body.size() - 400 : 0);
  EXPECT_EQ(body.find("\"finish_reason\":\""), std::string::npos);  // cut short, not finished
  const std::string end = "data: [DONE]\n\n\r\n0\r\n\r\n";          // the last event, then the last chunk
  ASSERT_GE(body.size(), end.size());
  EXPECT_EQ(body.substr(body.size() - end.size()), end);
  EXPECT_NE(srv.log().find("the rest were cut short"), std::string::npos) << srv.log();
  std::printf(
      "[figures] SIGTERM past the grace period (1 s): the 2000-token stream ended with the error event, "
      "exit code %d after %.2f s\n",
      rc, exit_s);
}

}  // namespace
