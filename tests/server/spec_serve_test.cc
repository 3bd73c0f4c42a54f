// `beluga serve --speculative-config`: chat completions (greedy, n > 1, stop strings, a repeated
// prompt that hits the prefix cache) give the same text as a server without speculation, /metrics
// counts drafts, and a bad configuration or a model without MTP layers stops the server with a clear
// message.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "../common/http_client.h"
#include "../common/serve_process.h"

namespace beluga::server::testing {
namespace {

// `beluga serve` on `model` (the demo model unless told) with `extra` flags.
beluga::testing::ChildProcess serve(const std::vector<std::string>& extra,
                                    const std::string& model = beluga::testing::demo_model()) {
  return beluga::testing::beluga_serve(beluga::testing::serve_flags(model, 64, extra));
}

nlohmann::json chat(int port, const std::string& text, nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json body = {
      {"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", 60}, {"temperature", 0}};
  body.update(extra);
  const HttpReply r = http_post(port, "/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200) << r.body;
  return r.json();
}

std::vector<std::string> contents(const nlohmann::json& j) {
  std::vector<std::string> v;
  for (const auto& c : j["choices"])
    v.push_back(c["message"]["content"].get<std::string>() + "|" + c["finish_reason"].get<std::string>());
  return v;
}

TEST(SpecServe, ChatCompletionsMatchAServerWithoutSpeculation) {
  // Fixed gating: the draft counts below assume speculating steps (cost gating falls back to plain
  // decode on the CPU, where a verify step costs about 3x a plain one).
  auto plain = serve({});
  auto spec =
      serve({"--speculative-config", R"({"method":"mtp","num_speculative_tokens":2,"gating":"fixed"})"});
  ASSERT_GT(plain.port(), 0) << plain.log();
  ASSERT_GT(spec.port(), 0) << spec.log();
  const std::vector<std::string> asks = {
      "Write a Python function `read_json(path)`: Load a JSON file and return its contents.",
      "Write a Python function `chunks(items, n)`: Split a list into consecutive chunks of size n."};
  for (const auto& q : asks) {
    const auto base = contents(chat(plain.port(), q));
    ASSERT_EQ(base.size(), 1u);
    EXPECT_EQ(contents(chat(spec.port(), q)), base) << q;
    EXPECT_EQ(contents(chat(spec.port(), q)), base) << q << " (again: prefix cache hit)";
    const nlohmann::json n2 = {{"n", 2}};
    EXPECT_EQ(contents(chat(spec.port(), q, n2)), contents(chat(plain.port(), q, n2))) << q;
    // A stop string taken from the middle of the answer.
    const std::string text = base[0].substr(0, base[0].rfind('|'));
    ASSERT_GT(text.size(), 40u);
    const nlohmann::json stop = {{"stop", {text.substr(30, 3)}}};
    const auto want = contents(chat(plain.port(), q, stop));
    EXPECT_EQ(want[0].substr(want[0].rfind('|')), "|stop");
    EXPECT_EQ(contents(chat(spec.port(), q, stop)), want) << q;
  }
  const std::string m = http_get(spec.port(), "/metrics").body;
  EXPECT_GT(metric_value(m, "beluga_spec_decode_num_drafts_total"), 10) << m;
  EXPECT_GT(metric_value(m, "beluga_spec_decode_num_draft_tokens_total"), 10);
  EXPECT_GT(metric_value(m, "beluga_spec_decode_num_accepted_tokens_total"), 5);
  EXPECT_NE(m.find("beluga_spec_decode_accepted_per_position_total{model_name=\"beluga-demo-coder-mtp\","
                   "position=\"1\"}"),
            std::string::npos)
      << m;
  EXPECT_EQ(http_get(plain.port(), "/metrics").body.find("beluga_spec_decode"), std::string::npos);
}

TEST(SpecServe, BadConfigurationsStopTheServerWithAClearError) {
  {
    auto s = serve({"--speculative-config", R"({"method":"medusa","num_speculative_tokens":2})"});
    EXPECT_NE(s.wait_exit(std::chrono::seconds(60)), 0);
    EXPECT_NE(s.log().find("unknown method \"medusa\""), std::string::npos) << s.log();
  }
  {
    auto s = serve({"--speculative-config", R"({"method":"mtp","num_speculative_tokens":1})"},
                   std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv3-tiny");
    EXPECT_NE(s.wait_exit(std::chrono::seconds(60)), 0);
    EXPECT_NE(s.log().find("MTP module"), std::string::npos) << s.log();
  }
}

}  // namespace
}  // namespace beluga::server::testing
