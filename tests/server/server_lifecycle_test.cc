// The build pool (request building off the I/O threads, bounded), the engine's health as /health and
// /ready report it, and the graceful drain (finish within the grace period, else cut streams short
// with the API's error event).
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "fake_server.h"
#include "server/build_pool.h"
#include "server/engine_health.h"
#include "server/restartable_engine.h"

namespace beluga::server {
namespace {

using testing::http_get;
using testing::http_post;
using testing::metric_value;
using Json = nlohmann::json;
using LifecycleTest = testing::FakeServerTest;

// Waits (up to 20 s) until `pred` holds.
template <class P>
bool eventually(P pred) {
  for (int i = 0; i < 2000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(BuildPool, RefusesPastItsQueueAndDropsQueuedTasksOnStop) {
  BuildPool pool(1, 2);
  std::promise<void> release;
  std::shared_future<void> gate = release.get_future().share();
  std::atomic<int> ran{0};
  std::atomic<bool> started{false};
  ASSERT_TRUE(pool.try_submit([&] {
    started = true;
    gate.wait();
    ++ran;
  }));
  ASSERT_TRUE(eventually([&] { return started.load(); }));  // the thread holds the first task
  EXPECT_TRUE(pool.try_submit([&] { ++ran; }));
  EXPECT_TRUE(pool.try_submit([&] { ++ran; }));
  EXPECT_FALSE(pool.try_submit([&] { ++ran; }));  // two queued: full
  EXPECT_EQ(pool.queued(), 2u);
  std::thread stopper([&] { pool.stop(); });
  ASSERT_TRUE(eventually([&] { return pool.queued() == 0; }));  // stop() took the queue
  release.set_value();
  stopper.join();
  EXPECT_EQ(ran.load(), 1);  // the running task finished; the queued ones were dropped unrun
  EXPECT_FALSE(pool.try_submit([&] { ++ran; }));
}

TEST(EngineHealth, FailingStepsAndStallsAreUnhealthy) {
  using namespace std::chrono_literals;
  EngineHealth h(/*stall_after=*/60s, /*window=*/10s, /*min_failed=*/3);
  const auto t0 = EngineHealth::Clock::time_point{} + 1000s;
  EngineStats s;
  EXPECT_TRUE(h.observe(s, t0).ok);
  s.steps = 100;
  s.steps_failed = 2;  // a couple of failures among many steps: healthy
  EXPECT_TRUE(h.observe(s, t0 + 1s).ok);
  s.steps = 110;
  s.steps_failed = 12;  // every step of the last 10 s failed
  HealthVerdict v = h.observe(s, t0 + 12s);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.reason.find("10 of the engine's last 10 steps failed"), std::string::npos) << v.reason;
  s.steps = 112;
  EXPECT_FALSE(h.observe(s, t0 + 13s).ok);
  // Steps succeed again: once the failures leave the window, healthy.
  s.steps = 300;
  EXPECT_TRUE(h.observe(s, t0 + 30s).ok);
  // Work pending and no step for 60 s: stalled. Without work, a still counter is fine.
  s.waiting = 2;
  EXPECT_TRUE(h.observe(s, t0 + 31s).ok);
  v = h.observe(s, t0 + 91s);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.reason.find("no engine step finished in 61 s while 2 requests"), std::string::npos) << v.reason;
  s.steps = 301;
  EXPECT_TRUE(h.observe(s, t0 + 92s).ok);
  s.waiting = 0;
  EXPECT_TRUE(h.observe(s, t0 + 500s).ok);
}

// A new engine (a restart: another generation) starts a new history: the failed steps that took the
// old one down do not make the new one unhealthy, though the counters continue.
TEST(EngineHealth, ANewEngineGenerationStartsANewHistory) {
  using namespace std::chrono_literals;
  EngineHealth h(60s, 10s, 3);
  const auto t0 = EngineHealth::Clock::time_point{} + 1000s;
  EngineStats s;
  s.steps = 100;
  EXPECT_TRUE(h.observe(s, t0, 1).ok);
  s.steps = 105;
  s.steps_failed = 5;
  EXPECT_FALSE(h.observe(s, t0 + 1s, 1).ok);
  EXPECT_FALSE(h.observe(s, t0 + 2s, 1).ok);  // same engine: still within the window
  s.steps = 107;                              // the new engine's first steps
  EXPECT_TRUE(h.observe(s, t0 + 3s, 2).ok);
  s.steps = 110;
  EXPECT_TRUE(h.observe(s, t0 + 4s, 2).ok);
  s.steps = 114;
  s.steps_failed = 9;  // the new engine's own failures still count
  EXPECT_FALSE(h.observe(s, t0 + 5s, 2).ok);
}

// The stats of a restarted instance: counters of the engines taken down plus the current one's,
// gauges of the current one only.
TEST(RestartableEngine, CountersContinueAcrossEngines) {
  EngineStats old, now;
  old.requests_finished = 7;
  old.generation_tokens = 300;
  old.steps = 50;
  old.steps_failed = 2;
  old.running = 3;
  old.spec_accepted_per_position = {4, 2};
  now.requests_finished = 1;
  now.generation_tokens = 20;
  now.steps = 6;
  now.running = 1;
  now.kv_blocks_total = 90;
  now.spec_accepted_per_position = {1};
  const EngineStats s = add_engine_counters(old, now);
  EXPECT_EQ(s.requests_finished, 8);
  EXPECT_EQ(s.generation_tokens, 320);
  EXPECT_EQ(s.steps, 56);
  EXPECT_EQ(s.steps_failed, 2);
  EXPECT_EQ(s.running, 1);
  EXPECT_EQ(s.kv_blocks_total, 90);
  EXPECT_EQ(s.spec_accepted_per_position, (std::vector<int64_t>{5, 2}));
}

TEST_F(LifecycleTest, HealthAndReadyReflectFailingEngineSteps) {
  start();
  EXPECT_EQ(http_get(port_, "/health").status, 200);
  auto r = http_get(port_, "/ready");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.json()["status"], "ready");
  EXPECT_EQ(r.retry_after, "");
  engine_->add_steps(10, 10);  // every step fails
  r = http_get(port_, "/health");
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.retry_after, "1");  // 503s say when to come back
  EXPECT_EQ(r.json()["status"], "unhealthy");
  EXPECT_NE(std::string(r.json()["reason"]).find("10 of the engine's last 10 steps failed"),
            std::string::npos)
      << r.body;
  EXPECT_EQ(http_get(port_, "/ready").status, 503);
}

// Two large bodies keep the build threads busy; /health (on the I/O threads) still answers while they
// do, and a request past the build queue gets a 503 in the API's shape.
TEST_F(LifecycleTest, LargeRequestsAreBuiltOffTheIoThreadsInABoundedQueue) {
  ServerConfig cfg;
  cfg.build_threads = 1;
  cfg.build_queue = 1;
  cfg.io_threads = 1;
  start(cfg);
  // ~6 MiB of short words: a second or more of tokenizing per request on one core.
  std::string big;
  big.reserve(6u << 20);
  for (int i = 0; big.size() < (6u << 20); ++i) big += "w" + std::to_string(i % 977) + " ";
  const Json body = chat();
  Json b = body;
  b["messages"][0]["content"] = big;
  const std::string text = b.dump();
  big.clear();
  auto send_big = [&] {
    return testing::http_request(port_, testing::Verb::post, "/v1/chat/completions", text);
  };
  auto first = std::async(std::launch::async, send_big);
  ASSERT_TRUE(eventually(
      [&] { return metric_value(http_get(port_, "/metrics").body, "beluga_requests_building") >= 1; }));
  auto second = std::async(std::launch::async, send_big);
  ASSERT_TRUE(eventually(
      [&] { return metric_value(http_get(port_, "/metrics").body, "beluga_requests_building") >= 2; }));
  // One building, one queued: the queue is full.
  auto r = http_post(port_, "/v1/chat/completions", body);
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_EQ(r.retry_after, "1");
  EXPECT_NE(std::string(r.json()["error"]["message"]).find("overloaded"), std::string::npos) << r.body;
  // The I/O thread is free: /health answers while both builds are still in progress.
  EXPECT_EQ(http_get(port_, "/health", std::chrono::seconds(10)).status, 200);
  EXPECT_GE(metric_value(http_get(port_, "/metrics").body, "beluga_requests_building"), 1);
  // Both large requests are then answered (the prompt is longer than the 512-token context: 400).
  EXPECT_EQ(first.get().status, 400);
  EXPECT_EQ(second.get().status, 400);
  EXPECT_EQ(metric_value(http_get(port_, "/metrics").body, "beluga_builds_rejected_total"), 1);
}

// A stream in flight when the drain begins finishes within the grace period; a request that
// arrives on an open connection meanwhile gets 503s, and new connections are refused.
TEST_F(LifecycleTest, DrainLetsStreamsFinishWithinTheGracePeriod) {
  start({}, 128, std::string(40, 'a') + " done", std::chrono::milliseconds(20));
  testing::RawConnection pending = connect_raw();  // headers started before the drain
  pending.send("GET /ready HTTP/1.1\r\nHost: x\r\n");
  auto stream = std::async(std::launch::async, [&] {
    return http_post(port_, "/v1/chat/completions", chat({{"stream", true}}));
  });
  ASSERT_TRUE(eventually([&] { return engine_->active() >= 1; }));
  auto drained = std::async(std::launch::async, [&] { return server_->drain(std::chrono::seconds(20)); });
  // The listener closes: wait until connecting fails.
  ASSERT_TRUE(eventually([&] { return !testing::RawConnection::try_connect(port_); }));
  pending.send("\r\n");
  const testing::HttpReply ready = pending.read_response();
  EXPECT_EQ(ready.status, 503);
  EXPECT_NE(ready.body.find("draining"), std::string::npos) << ready.body;
  EXPECT_FALSE(ready.keep_alive);
  EXPECT_TRUE(drained.get());  // everything finished in time
  auto r = stream.get();
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(r.body.find("\"error\""), std::string::npos) << r.body;
  EXPECT_NE(r.body.find("\"finish_reason\":\"stop\""), std::string::npos);
}

// A stream still running when the grace period ends is cut short: the API's error event, then the
// stream's proper end; its engine request is aborted.
TEST_F(LifecycleTest, DrainCutsStreamsShortAfterTheGracePeriod) {
  start({}, 128, std::string(2000, 'a'), std::chrono::milliseconds(20));
  auto stream = std::async(std::launch::async, [&] {
    return http_post(port_, "/v1/chat/completions", chat({{"stream", true}}));
  });
  auto msg = std::async(std::launch::async, [&] {
    return http_post(port_, "/v1/messages",
                     Json{{"model", "demo"},
                          {"max_tokens", 4000},
                          {"stream", true},
                          {"messages", Json::array({Json{{"role", "user"}, {"content", "hi"}}})}});
  });
  ASSERT_TRUE(eventually([&] { return engine_->active() >= 2; }));
  EXPECT_FALSE(server_->drain(std::chrono::seconds(1)));
  auto r = stream.get();
  ASSERT_EQ(r.status, 200);  // the stream had begun; it ends with an error event and [DONE]
  EXPECT_NE(r.body.find("shutting down"), std::string::npos) << r.body.substr(0, 300);
  EXPECT_EQ(r.body.rfind("data: [DONE]\n\n"), r.body.size() - 14);
  auto m = msg.get();
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.body.find("event: error"), std::string::npos);
  EXPECT_EQ(engine_->aborted().size(), 2u);
}

}  // namespace
}  // namespace beluga::server
