// The utility endpoints over HTTP against a scripted engine (utility_routes.h): /tokenize encodes
// exactly what a generation request submits, /detokenize inverts it and checks ids, Anthropic's
// /v1/messages/count_tokens counts a Messages prompt, GET /version; errors in each API's shape; all of
// them behind --api-key; the web page's files at / with their content types; the access log.
#include <gtest/gtest.h>

#include "fake_server.h"
#include "server/access_log.h"
#include "server/server.h"
#include "server/version.h"

namespace beluga::server {
namespace {

using testing::http_post;
using testing::http_request;
using testing::Verb;
using Json = nlohmann::json;
using Reply = testing::HttpReply;
using Headers = std::vector<std::pair<std::string, std::string>>;

class EndpointsTest : public testing::FakeServerTest {
 protected:
  void start(ServerConfig cfg = {}, bool ready = true) {
    cfg.access_log = access_log_;
    set_text("ok");
    launch(cfg, Launch{.ready = ready});
  }
  // The prompt ids the engine received for the last generation request.
  std::vector<int> last_prompt() const {
    auto p = engine_->prompts();
    return p.empty() ? std::vector<int>{} : p.back();
  }

  bool access_log_ = false;  // the access log tests turn it on
};

const Json kTools = Json::array(
    {Json{{"type", "function"},
          {"function",
           {{"name", "get_weather"},
            {"description", "Weather of a city"},
            {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}});

TEST_F(EndpointsTest, TokenizeMessagesEqualsWhatAChatRequestSubmits) {
  start();
  // A user who types a control token's spelling gets text, not the token.
  const Json messages = Json::array({Json{{"role", "system"}, {"content", "Be brief."}},
                                     Json{{"role", "user"}, {"content", "Hi <｜Assistant｜> there"}},
                                     Json{{"role", "assistant"}, {"content", "Hello."}},
                                     Json{{"role", "user"}, {"content", "Weather in Paris?"}}});
  for (const bool with_tools : {false, true}) {
    Json body{{"model", "demo"}, {"messages", messages}};
    if (with_tools) body["tools"] = kTools;
    Reply t = http_post(port_, "/tokenize", body);
    ASSERT_EQ(t.status, 200) << t.body;
    Json gen = body;
    gen["max_tokens"] = 2;
    ASSERT_EQ(http_post(port_, "/v1/chat/completions", gen).status, 200);
    const auto ids = t.json()["tokens"].get<std::vector<int>>();
    EXPECT_EQ(ids, last_prompt()) << "tools: " << with_tools;
    EXPECT_EQ(t.json()["count"], ids.size());
    EXPECT_EQ(t.json()["max_model_len"], 512);
    const int assistant_id = tokenizer_->encode("<｜Assistant｜>", /*allow_special=*/true).at(0);
    // The typed one stays text: the only <｜Assistant｜> tokens are the template's (two turns' worth).
    EXPECT_EQ(std::count(ids.begin(), ids.end(), assistant_id), 2);
  }
}

TEST_F(EndpointsTest, TokenizePromptEqualsWhatACompletionSubmits) {
  start();
  const std::string text = "def f(x):\n    return x  # <｜User｜>";
  Reply t = http_post(port_, "/tokenize", Json{{"prompt", text}});
  ASSERT_EQ(t.status, 200) << t.body;
  ASSERT_EQ(http_post(port_, "/v1/completions", Json{{"prompt", text}, {"max_tokens", 2}}).status, 200);
  const auto ids = t.json()["tokens"].get<std::vector<int>>();
  EXPECT_EQ(ids, last_prompt());
  std::vector<int> expect{0};  // BOS, then the text with special-token matching off
  for (int id : tokenizer_->encode(text, /*allow_special=*/false)) expect.push_back(id);
  EXPECT_EQ(ids, expect);
  // add_special_tokens: false leaves the BOS out.
  Reply t2 = http_post(port_, "/tokenize", Json{{"prompt", text}, {"add_special_tokens", false}});
  ASSERT_EQ(t2.status, 200);
  EXPECT_EQ(t2.json()["tokens"].get<std::vector<int>>(), std::vector<int>(expect.begin() + 1, expect.end()));
  // A prompt longer than the context is still counted (the client compares count and max_model_len).
  std::string longer;
  for (int i = 0; i < 300; ++i) longer += "alpha beta ";
  Reply t3 = http_post(port_, "/tokenize", Json{{"prompt", longer}});
  ASSERT_EQ(t3.status, 200) << t3.body;
  EXPECT_GT(t3.json()["count"].get<int>(), 512);
}

TEST_F(EndpointsTest, DetokenizeInvertsTokenizeAndChecksIds) {
  start();
  const std::string text = "print('héllo') <｜User｜>";
  Reply t = http_post(port_, "/tokenize", Json{{"prompt", text}, {"add_special_tokens", false}});
  ASSERT_EQ(t.status, 200);
  Reply d = http_post(port_, "/detokenize", Json{{"tokens", t.json()["tokens"]}, {"model", "demo"}});
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.json()["prompt"], text);
  const int vocab = int(tokenizer_->vocab_size());
  for (const Json& bad : {Json{{"tokens", {1, vocab}}}, Json{{"tokens", {-1}}}, Json{{"tokens", {"a"}}},
                          Json{{"tokens", 5}}, Json::object()}) {
    Reply r = http_post(port_, "/detokenize", bad);
    EXPECT_EQ(r.status, 400) << bad.dump();
    EXPECT_TRUE(r.json()["error"]["message"].is_string()) << r.body;
  }
  Reply oob = http_post(port_, "/detokenize", Json{{"tokens", {1, vocab}}});
  EXPECT_EQ(oob.json()["error"]["param"], "tokens[1]") << oob.body;
  EXPECT_EQ(http_post(port_, "/detokenize", Json{{"tokens", {1}}, {"model", "other"}}).status, 404);
}

TEST_F(EndpointsTest, CountTokensEqualsTheMessagesPrompt) {
  start();
  const Json anthropic_tools = Json::array(
      {Json{{"name", "get_weather"},
            {"description", "Weather of a city"},
            {"input_schema", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}});
  Json body{
      {"model", "demo"},
      {"system", Json::array({Json{
                     {"type", "text"}, {"text", "Be brief."}, {"cache_control", {{"type", "ephemeral"}}}}})},
      {"tools", anthropic_tools},
      {"messages", Json::array({Json{{"role", "user"}, {"content", "Weather in Paris?"}}})}};
  Reply c = http_post(port_, "/v1/messages/count_tokens", body);
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.json().size(), 1u);
  Json gen = body;
  gen["max_tokens"] = 2;
  ASSERT_EQ(http_post(port_, "/v1/messages", gen).status, 200);
  EXPECT_EQ(c.json()["input_tokens"], last_prompt().size());
  // Errors in Anthropic's shape.
  Reply bad = http_post(port_, "/v1/messages/count_tokens", Json{{"messages", "nope"}});
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.json()["type"], "error") << bad.body;
  Reply notjson = http_request(port_, Verb::post, "/v1/messages/count_tokens", "{");
  EXPECT_EQ(notjson.status, 400);
  EXPECT_EQ(notjson.json()["type"], "error");
}

TEST_F(EndpointsTest, VersionAndErrors) {
  start();
  Reply v = http_request(port_, Verb::get, "/version");
  ASSERT_EQ(v.status, 200);
  EXPECT_EQ(v.json(), (Json{{"version", kVersion}}));
  EXPECT_EQ(http_request(port_, Verb::post, "/version").status, 405);
  EXPECT_EQ(http_request(port_, Verb::get, "/tokenize").status, 405);
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", "a"}, {"messages", Json::array()}}).status, 400);
  EXPECT_EQ(http_post(port_, "/tokenize", Json::object()).status, 400);
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", 3}}).status, 400);
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", "a"}, {"model", "other"}}).status, 404);
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", "a"}, {"return_token_strs", true}}).status, 400);
  EXPECT_EQ(http_request(port_, Verb::post, "/tokenize", "[1]").status, 400);
  EXPECT_EQ(http_request(port_, Verb::post, "/tokenize", "{\"prompt\": \"\xff\"}").status, 400);
  Reply bad_msgs = http_post(port_, "/tokenize", Json{{"messages", Json::array({Json{{"role", "nobody"}}})}});
  EXPECT_EQ(bad_msgs.status, 400);
  EXPECT_TRUE(bad_msgs.json()["error"]["message"].is_string()) << bad_msgs.body;
}

TEST_F(EndpointsTest, WhileLoadingOnlyVersionAnswers) {
  start({}, /*ready=*/false);
  EXPECT_EQ(http_request(port_, Verb::get, "/version").status, 200);
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", "a"}}).status, 503);
  EXPECT_EQ(http_post(port_, "/v1/messages/count_tokens", Json::object()).status, 503);
}

TEST_F(EndpointsTest, AllBehindTheApiKey) {
  ServerConfig cfg;
  cfg.api_key = "sekret";
  start(cfg);
  const Headers auth{{"authorization", "Bearer sekret"}};
  const Json msgs{{"model", "demo"}, {"messages", Json::array({Json{{"role", "user"}, {"content", "x"}}})}};
  EXPECT_EQ(http_request(port_, Verb::get, "/version").status, 401);
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", "a"}}).status, 401);
  EXPECT_EQ(http_post(port_, "/detokenize", Json{{"tokens", {1}}}, {{"authorization", "Bearer nope"}}).status,
            401);
  Reply c = http_post(port_, "/v1/messages/count_tokens", msgs);
  EXPECT_EQ(c.status, 401);
  EXPECT_EQ(c.json()["error"]["type"], "authentication_error");
  EXPECT_EQ(http_request(port_, Verb::get, "/version", "", auth).status, 200);
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", "a"}}, auth).status, 200);
  EXPECT_EQ(http_post(port_, "/detokenize", Json{{"tokens", {1}}}, auth).status, 200);
  EXPECT_EQ(http_post(port_, "/v1/messages/count_tokens", msgs, {{"x-api-key", "sekret"}}).status, 200);
  // The web page itself is public (it asks for the key); what it calls is not.
  Reply page = http_request(port_, Verb::get, "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_EQ(page.content_type, "text/html; charset=utf-8");
  EXPECT_NE(page.body.find("<script src=\"app.js\">"), std::string::npos);
  EXPECT_EQ(http_request(port_, Verb::get, "/app.js").content_type, "text/javascript; charset=utf-8");
  EXPECT_EQ(http_request(port_, Verb::post, "/").status, 405);
  EXPECT_EQ(http_request(port_, Verb::get, "/nope").status, 404);
}

TEST(AccessLog, LineFormat) {
  AccessRecord r;
  r.client = "10.0.0.7";
  r.method = "POST";
  r.path = "/v1/chat/completions";
  r.status = 200;
  r.prompt_tokens = 26;
  r.completion_tokens = 48;
  r.ttft_s = 0.0314;
  r.duration_s = 0.4121;
  EXPECT_EQ(
      format_access_line(r),
      "access: 10.0.0.7 \"POST /v1/chat/completions\" 200 prompt_tokens=26 completion_tokens=48 ttft=0.031s "
      "time=0.412s\n");
  AccessRecord g;
  g.method = "GET";
  g.path = "/x\"\n\x1b[31mforged";  // a client-chosen path cannot forge a line or send escape codes
  g.status = 404;
  EXPECT_EQ(format_access_line(g), "access: - \"GET /x\\x22\\x0a\\x1b[31mforged\" 404 time=0.000s\n");
}

TEST_F(EndpointsTest, AccessLogLinePerRequest) {
  access_log_ = true;
  start();
  ::testing::internal::CaptureStderr();
  const Json msgs = Json::array({Json{{"role", "user"}, {"content", "Hi"}}});
  ASSERT_EQ(http_post(port_, "/v1/chat/completions", Json{{"messages", msgs}, {"max_tokens", 4}}).status,
            200);
  const size_t prompt = last_prompt().size();
  const size_t completion = tokenizer_->encode("ok", false).size();
  ASSERT_EQ(
      http_post(port_, "/v1/chat/completions", Json{{"messages", msgs}, {"max_tokens", 4}, {"stream", true}})
          .status,
      200);
  EXPECT_EQ(http_request(port_, Verb::get, "/nope?api_key=secret").status, 404);
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", "a"}}).status, 200);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string gen =
      "access: 127.0.0.1 \"POST /v1/chat/completions\" 200 prompt_tokens=" + std::to_string(prompt) +
      " completion_tokens=" + std::to_string(completion) + " ttft=";
  size_t first = log.find(gen);
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_NE(log.find(gen, first + 1), std::string::npos) << "the streamed request too: " << log;
  EXPECT_NE(log.find("access: 127.0.0.1 \"GET /nope\" 404 time="), std::string::npos) << log;
  EXPECT_EQ(log.find("secret"), std::string::npos) << "no query string: " << log;
  EXPECT_NE(log.find("access: 127.0.0.1 \"POST /tokenize\" 200 time="), std::string::npos) << log;
  size_t lines = 0;
  for (size_t p = log.find("access: "); p != std::string::npos; p = log.find("access: ", p + 1)) ++lines;
  EXPECT_EQ(lines, 4u) << log;
}

TEST_F(EndpointsTest, AccessLogOff) {
  start();  // access_log_ false, as `beluga serve --no-access-log`
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(http_post(port_, "/tokenize", Json{{"prompt", "a"}}).status, 200);
  EXPECT_EQ(http_request(port_, Verb::get, "/nope").status, 404);
  EXPECT_EQ(::testing::internal::GetCapturedStderr().find("access:"), std::string::npos);
}

}  // namespace
}  // namespace beluga::server
