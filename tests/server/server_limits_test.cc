// The server's protective limits against a scripted engine: constant-time key check, fan-out
// counted in sequences, internal errors as 500 with a logged id (and the server keeps serving),
// the connection cap, and the header / body / idle timeouts.
#include <gtest/gtest.h>

#include <thread>

#include "fake_server.h"
#include "server/auth.h"

namespace beluga::server {
namespace {

using Json = nlohmann::json;
using testing::http_get;
using testing::http_post;

using LimitsTest = testing::FakeServerTest;

TEST(ApiKey, MatchesOnlyTheExactKey) {
  EXPECT_TRUE(api_key_matches("sk-secret", "sk-secret"));
  EXPECT_FALSE(api_key_matches("sk-secreT", "sk-secret"));
  EXPECT_FALSE(api_key_matches("sk-secre", "sk-secret"));    // a prefix
  EXPECT_FALSE(api_key_matches("sk-secret1", "sk-secret"));  // longer
  EXPECT_FALSE(api_key_matches("", "sk-secret"));
  EXPECT_FALSE(api_key_matches(std::string("sk-secret\0", 10), "sk-secret"));
  EXPECT_TRUE(api_key_matches("", ""));
}

TEST_F(LimitsTest, FanOutIsCountedInSequences) {
  start({}, /*max_seqs_per_request=*/64);
  Json prompts = Json::array();
  // Appended, not "p" + to_string(i): GCC 12 at -O3 warns (-Wrestrict) on that insert, falsely.
  for (int i = 0; i < 64; ++i) prompts.push_back(std::string("p").append(std::to_string(i)));
  // 64 prompts x n=2 = 128 sequences > 64: refused before anything reaches the engine.
  auto r = http_post(port_, "/v1/completions", Json{{"model", "demo"}, {"prompt", prompts}, {"n", 2}});
  ASSERT_EQ(r.status, 400) << r.body;
  const std::string msg = r.json()["error"]["message"];
  EXPECT_NE(msg.find("128 sequences"), std::string::npos) << msg;
  EXPECT_NE(msg.find("limit is 64"), std::string::npos) << msg;
  EXPECT_EQ(r.json()["error"]["param"], "n");
  // Chat: n alone counts.
  r = http_post(port_, "/v1/chat/completions", chat({{"n", 65}}));
  ASSERT_EQ(r.status, 400) << r.body;
  EXPECT_NE(std::string(r.json()["error"]["message"]).find("limit is 64"), std::string::npos);
  EXPECT_EQ(engine_->submitted_count(), 0u);
  // At the limit: served (32 prompts x n=2 = 64).
  prompts.erase(prompts.begin() + 32, prompts.end());
  r = http_post(port_, "/v1/completions",
                Json{{"model", "demo"}, {"prompt", prompts}, {"n", 2}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["choices"].size(), 64u);
}

TEST_F(LimitsTest, HandlerExceptionIsA500WithALoggedIdAndTheServerKeepsServing) {
  start();
  engine_->set_throw_on_submit(true);
  ::testing::internal::CaptureStderr();
  auto r = http_post(port_, "/v1/chat/completions", chat());
  auto s = http_post(port_, "/v1/chat/completions", chat({{"stream", true}}));
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(r.status, 500) << r.body;
  const std::string msg = r.json()["error"]["message"];
  const size_t at = msg.find("err_");
  ASSERT_NE(at, std::string::npos) << msg;
  const std::string id = msg.substr(at, msg.find(';', at) - at);
  // The log line carries the id and the cause; the client sees only the id.
  EXPECT_NE(log.find(id), std::string::npos) << log;
  EXPECT_NE(log.find("submit failed (injected)"), std::string::npos) << log;
  EXPECT_EQ(msg.find("injected"), std::string::npos) << msg;
  EXPECT_EQ(s.status, 500) << s.body;  // the throw came before the stream's head: a plain 500
  // Anthropic's shape on /v1/messages.
  ::testing::internal::CaptureStderr();
  r = http_post(port_, "/v1/messages",
                Json{{"model", "demo"},
                     {"max_tokens", 8},
                     {"messages", Json::array({Json{{"role", "user"}, {"content", "hi"}}})}});
  ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(r.status, 500);
  EXPECT_EQ(r.json()["type"], "error");
  EXPECT_EQ(r.json()["error"]["type"], "api_error");
  // The server still serves.
  engine_->set_throw_on_submit(false);
  r = http_post(port_, "/v1/chat/completions", chat());
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(http_get(port_, "/health").status, 200);
}

TEST_F(LimitsTest, ConnectionsPastTheCapGetA503) {
  ServerConfig cfg;
  cfg.max_connections = 4;
  start(cfg);
  std::vector<testing::RawConnection> held;
  for (int i = 0; i < 4; ++i) held.push_back(connect_raw());
  // The server counts a connection once it has accepted it: poll until the cap shows.
  testing::HttpReply r;
  for (int i = 0; i < 500 && r.status != 503; ++i) {
    r = http_get(port_, "/health");
    if (r.status != 503) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(r.status, 503) << r.body;
  EXPECT_NE(std::string(r.json()["error"]["message"]).find("connection limit (4"), std::string::npos);
  held.pop_back();  // one closes: the next connection is served
  bool served = false;
  for (int i = 0; i < 200 && !served; ++i) {
    served = http_get(port_, "/health").status == 200;
    if (!served) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(served);
  held.clear();
  for (int i = 0; i < 200; ++i) {
    std::string page = http_get(port_, "/metrics").body;
    if (testing::metric_value(page, "beluga_connections_rejected_total") >= 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(testing::metric_value(http_get(port_, "/metrics").body, "beluga_connections_rejected_total"), 1);
}

TEST_F(LimitsTest, SlowHeadersAndSlowBodiesAreDroppedButIdleKeepAliveIsNot) {
  ServerConfig cfg;
  cfg.header_timeout_s = 1;
  cfg.body_timeout_s = 1;
  cfg.idle_timeout_s = 60;
  start(cfg);
  // Headers that never finish: dropped after the header timeout (generous bound: 10 s).
  testing::RawConnection slow = connect_raw();
  slow.send("GET /health HTTP/1.1\r\nHost: x\r\n");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(closed_by_server_within(slow, std::chrono::seconds(10)));
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(900));
  // A connection that sends nothing at all: the same.
  testing::RawConnection silent = connect_raw();
  EXPECT_TRUE(closed_by_server_within(silent, std::chrono::seconds(10)));
  // A body that stops half-way.
  testing::RawConnection half = connect_raw();
  half.send(
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
      "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"mo");
  EXPECT_TRUE(closed_by_server_within(half, std::chrono::seconds(10)));
  // A keep-alive connection idle between requests for longer than the header timeout stays open.
  testing::RawConnection ka = connect_raw();
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  for (int i = 0; i < 2; ++i) {
    ka.send(get);
    EXPECT_EQ(ka.read_response().status, 200);
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  }
}

}  // namespace
}  // namespace beluga::server
