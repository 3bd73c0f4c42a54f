// Stored Responses over HTTP against a scripted engine: previous_response_id, GET / DELETE
// /v1/responses/{id}, tenants (API keys) kept apart, store: false, streamed responses, a function call
// round trip through the store, the store's capacity and the store turned off.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/server.h"
#include "server_test.h"

namespace beluga::server {
namespace {

using Json = nlohmann::json;
using testing::Headers;
using testing::http_post;
using testing::http_request;
using testing::kToolText;
using testing::parse_sse;
using testing::Reply;
using testing::ServerTest;
using testing::Verb;

const Headers kAlice{{"authorization", "Bearer alice"}};
const Headers kBob{{"authorization", "Bearer bob"}};

Json responses_body(Json input, Json extra = Json::object()) {
  Json b{{"model", "demo"}, {"input", std::move(input)}};
  for (auto& [k, v] : extra.items()) b[k] = v;
  return b;
}

void expect_not_found(const Reply& r, const std::string& param) {
  EXPECT_EQ(r.status, 404) << r.body;
  const Json j = r.json();
  ASSERT_TRUE(j.is_object() && j["error"].is_object()) << r.body;
  EXPECT_TRUE(j["error"]["message"].is_string());
  if (param.empty())
    EXPECT_TRUE(j["error"]["param"].is_null()) << r.body;
  else
    EXPECT_EQ(j["error"]["param"], param) << r.body;
}

// previous_response_id continues a response's conversation (its input, then its output; not its
// instructions); GET returns the response as created; DELETE removes it; only its tenant sees it.
TEST_F(ServerTest, ResponsesPreviousResponseIdGetAndDelete) {
  start();
  Reply r1 = http_post(port_, "/v1/responses", responses_body("hi", {{"instructions", "Be brief."}}), kAlice);
  ASSERT_EQ(r1.status, 200) << r1.body;
  const Json j1 = r1.json();
  EXPECT_EQ(j1["store"], true);
  EXPECT_TRUE(j1["previous_response_id"].is_null());
  const std::string id1 = j1["id"];

  Reply g = http_request(port_, Verb::get, "/v1/responses/" + id1, "", kAlice);
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(g.json(), j1);

  Reply r2 =
      http_post(port_, "/v1/responses", responses_body("more", {{"previous_response_id", id1}}), kAlice);
  ASSERT_EQ(r2.status, 200) << r2.body;
  const Json j2 = r2.json();
  EXPECT_EQ(j2["previous_response_id"], id1);
  EXPECT_TRUE(j2["instructions"].is_null());
  EXPECT_GT(j2["usage"]["input_tokens"].get<int>(), j1["usage"]["input_tokens"].get<int>());
  // Its prompt is the whole conversation sent explicitly, without the first request's instructions.
  Json explicit_input = Json::array({Json{{"role", "user"}, {"content", "hi"}}});
  for (const auto& item : j1["output"]) explicit_input.push_back(item);
  explicit_input.push_back(Json{{"role", "user"}, {"content", "more"}});
  ASSERT_EQ(
      http_post(port_, "/v1/responses", responses_body(explicit_input, {{"store", false}}), kAlice).status,
      200);
  auto prompts = engine_->prompts();
  ASSERT_EQ(prompts.size(), 3u);
  EXPECT_EQ(prompts[1], prompts[2]);
  EXPECT_EQ(tokenizer_->decode(prompts[1]).find("Be brief."), std::string::npos);
  EXPECT_NE(tokenizer_->decode(prompts[0]).find("Be brief."), std::string::npos);

  // Another tenant (API key) sees no such response.
  expect_not_found(http_request(port_, Verb::get, "/v1/responses/" + id1, "", kBob), "");
  Reply other = http_post(port_, "/v1/responses", responses_body("x", {{"previous_response_id", id1}}), kBob);
  expect_not_found(other, "previous_response_id");
  EXPECT_EQ(other.json()["error"]["message"], "Previous response with id '" + id1 + "' not found.");
  EXPECT_EQ(other.json()["error"]["code"], "previous_response_not_found");
  expect_not_found(http_request(port_, Verb::delete_, "/v1/responses/" + id1, "", kBob), "");
  expect_not_found(http_post(port_, "/v1/responses",
                             responses_body("x", {{"previous_response_id", "resp_unknown"}}), kAlice),
                   "previous_response_id");

  Reply d = http_request(port_, Verb::delete_, "/v1/responses/" + id1, "", kAlice);
  ASSERT_EQ(d.status, 200) << d.body;
  EXPECT_EQ(d.json(), Json({{"id", id1}, {"object", "response"}, {"deleted", true}}));
  expect_not_found(http_request(port_, Verb::get, "/v1/responses/" + id1, "", kAlice), "");
  expect_not_found(http_request(port_, Verb::delete_, "/v1/responses/" + id1, "", kAlice), "");
  expect_not_found(
      http_post(port_, "/v1/responses", responses_body("x", {{"previous_response_id", id1}}), kAlice),
      "previous_response_id");
  // The response that continued the deleted one still carries its turn.
  const std::string id2 = j2["id"];
  Reply r4 =
      http_post(port_, "/v1/responses", responses_body("again", {{"previous_response_id", id2}}), kAlice);
  ASSERT_EQ(r4.status, 200) << r4.body;
  EXPECT_GT(r4.json()["usage"]["input_tokens"].get<int>(), j2["usage"]["input_tokens"].get<int>());
  EXPECT_NE(tokenizer_->decode(engine_->prompts().back()).find("hi"), std::string::npos);

  EXPECT_EQ(http_post(port_, "/v1/responses/" + id2, Json::object(), kAlice).status, 405);
  expect_not_found(http_request(port_, Verb::get, "/v1/responses/" + id2 + "/x", "", kAlice), "");
}

TEST_F(ServerTest, ResponsesStoreFalseAndStreamedResponses) {
  start();
  Reply a = http_post(port_, "/v1/responses", responses_body("hi", {{"store", false}}));
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.json()["store"], false);
  const std::string ida = a.json()["id"];
  expect_not_found(http_request(port_, Verb::get, "/v1/responses/" + ida), "");
  expect_not_found(http_post(port_, "/v1/responses", responses_body("x", {{"previous_response_id", ida}})),
                   "previous_response_id");
  Reply bad = http_post(port_, "/v1/responses", responses_body("hi", {{"store", "yes"}}));
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(bad.json()["error"]["param"], "store");

  // A streamed response is stored as its last event carried it.
  Reply s = http_post(port_, "/v1/responses", responses_body("hi", {{"stream", true}}));
  ASSERT_EQ(s.status, 200);
  const auto evs = parse_sse(s.body);
  ASSERT_FALSE(evs.empty());
  ASSERT_EQ(evs.back().event, "response.completed");
  const Json fin = Json::parse(evs.back().data)["response"];
  EXPECT_EQ(fin["store"], true);
  EXPECT_EQ(Json::parse(evs.front().data)["response"]["store"], true);
  const std::string ids = fin["id"];
  Reply g = http_request(port_, Verb::get, "/v1/responses/" + ids);
  ASSERT_EQ(g.status, 200) << g.body;
  EXPECT_EQ(g.json(), fin);
  // And continued, streamed too.
  Reply s2 = http_post(port_, "/v1/responses",
                       responses_body("more", {{"stream", true}, {"previous_response_id", ids}}));
  ASSERT_EQ(s2.status, 200);
  const Json fin2 = Json::parse(parse_sse(s2.body).back().data)["response"];
  EXPECT_EQ(fin2["previous_response_id"], ids);
  EXPECT_GT(fin2["usage"]["input_tokens"].get<int>(), fin["usage"]["input_tokens"].get<int>());
  EXPECT_EQ(http_request(port_, Verb::get, "/v1/responses/" + fin2["id"].get<std::string>()).status, 200);
}

// A response that ended with a function call, continued with the call's output, is the same prompt
// as the whole conversation sent explicitly.
TEST_F(ServerTest, ResponsesFunctionCallRoundTripThroughTheStore) {
  set_text(kToolText);
  start();
  const Json tools = Json::array(
      {Json{{"type", "function"}, {"name", "get_weather"}, {"parameters", {{"type", "object"}}}}});
  Reply r1 = http_post(port_, "/v1/responses", responses_body("weather?", {{"tools", tools}}));
  ASSERT_EQ(r1.status, 200) << r1.body;
  const Json j1 = r1.json();
  std::string call_id;
  for (const auto& it : j1["output"])
    if (it["type"] == "function_call") call_id = it["call_id"];
  ASSERT_FALSE(call_id.empty()) << r1.body;
  set_text("It is sunny.");
  const Json output =
      Json{{"type", "function_call_output"}, {"call_id", call_id}, {"output", "{\"temp_c\": 21}"}};
  Reply r2 = http_post(
      port_, "/v1/responses",
      responses_body(Json::array({output}), {{"tools", tools}, {"previous_response_id", j1["id"]}}));
  ASSERT_EQ(r2.status, 200) << r2.body;
  EXPECT_EQ(r2.json()["output"][0]["content"][0]["text"], "It is sunny.");
  Json explicit_input = Json::array({Json{{"role", "user"}, {"content", "weather?"}}});
  for (const auto& item : j1["output"]) explicit_input.push_back(item);
  explicit_input.push_back(output);
  ASSERT_EQ(http_post(port_, "/v1/responses", responses_body(explicit_input, {{"tools", tools}})).status,
            200);
  const auto prompts = engine_->prompts();
  ASSERT_EQ(prompts.size(), 3u);
  EXPECT_EQ(prompts[1], prompts[2]);
  EXPECT_NE(tokenizer_->decode(prompts[1]).find("temp_c"), std::string::npos);
}

TEST_F(ServerTest, ResponsesStoreCapacity) {
  ServerConfig cfg;
  cfg.max_stored_responses = 2;
  start(cfg);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    Reply r = http_post(port_, "/v1/responses", responses_body("hi"));
    ASSERT_EQ(r.status, 200) << r.body;
    ids.push_back(r.json()["id"]);
  }
  expect_not_found(http_request(port_, Verb::get, "/v1/responses/" + ids[0]), "");  // evicted
  EXPECT_EQ(http_request(port_, Verb::get, "/v1/responses/" + ids[1]).status, 200);
  EXPECT_EQ(http_request(port_, Verb::get, "/v1/responses/" + ids[2]).status, 200);
}

TEST_F(ServerTest, ResponsesStoreDisabled) {
  ServerConfig cfg;
  cfg.max_stored_responses = 0;
  start(cfg);
  Reply r = http_post(port_, "/v1/responses", responses_body("hi"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["store"], false);  // what happened, not what was asked
  expect_not_found(http_request(port_, Verb::get, "/v1/responses/" + r.json()["id"].get<std::string>()), "");
}

}  // namespace
}  // namespace beluga::server
