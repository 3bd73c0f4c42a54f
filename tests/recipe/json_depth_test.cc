// JSON nesting limit (recipe/json_depth.h): request bodies nested deeper than kMaxJsonDepth are a 400
// in each API's shape before anything walks them recursively; JSON inside request strings and in
// model-written tool calls stays text when it nests deeper; the recursive serializers refuse deeper
// values instead of overflowing the stack. The 100,000-deep cases are the ones that used to crash.
#include <gtest/gtest.h>

#include "recipe/chat_template.h"
#include "recipe/deepseek_encoders.h"
#include "recipe/json_depth.h"
#include "recipe/json_tool_call.h"
#include "recipe/py_json.h"
#include "recipe/request.h"
#include "util/error.h"

namespace beluga::recipe {
namespace {

using J = nlohmann::ordered_json;

std::string nest(int depth, const std::string& open = "[", const std::string& close = "]",
                 const std::string& inner = "") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  s += inner;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}
// `{"a": {"a": ... {} ...}}`, `depth` objects.
std::string nest_objects(int depth) {
  return nest(depth - 1, "{\"a\": ", "}", "{}");
}

// A built value `depth` arrays deep (iteratively: no recursion here either).
J nested_value(int depth) {
  J v = J::array();
  for (int i = 1; i < depth; ++i) v = J::array({std::move(v)});
  return v;
}

void expect_too_deep(Api api, const std::string& body) {
  try {
    parse_request(api, body);
    ADD_FAILURE() << "accepted: " << body.substr(0, 80);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_NE(e.body().dump().find("deeper than 128 levels"), std::string::npos) << e.body().dump();
  }
}

TEST(JsonDepth, TextDepthCountsContainersOutsideStrings) {
  EXPECT_EQ(json_text_depth("1"), 0);
  EXPECT_EQ(json_text_depth("[]"), 1);
  EXPECT_EQ(json_text_depth(R"({"a": [1, {"b": []}]})"), 4);
  EXPECT_EQ(json_text_depth(R"(["[[[[", "\"[[[", "\\"])"), 1);
  EXPECT_EQ(json_text_depth(nest(128)), 128);
  EXPECT_EQ(json_text_depth(nest(100000)), 129) << "stops one past the limit";
  EXPECT_EQ(json_value_depth(J::parse(R"({"a": [1, {"b": []}]})")), 4);
  EXPECT_EQ(json_value_depth(nested_value(128)), 128);
  EXPECT_EQ(json_value_depth(nested_value(5000)), 129);
  EXPECT_EQ(json_value_depth(J(3)), 0);
}

TEST(JsonDepth, ParseBoundedDiscardsDeeperText) {
  EXPECT_FALSE(parse_json_bounded(nest(128)).is_discarded());
  EXPECT_TRUE(parse_json_bounded(nest(129)).is_discarded());
  EXPECT_TRUE(parse_json_bounded(nest(100000)).is_discarded());
  EXPECT_TRUE(parse_json_bounded("{").is_discarded());
}

// The exact limit: a body whose deepest value is 128 levels (body object included) parses; 129 does not.
TEST(JsonDepth, LimitIsExactlyOneHundredTwentyEightLevels) {
  // body {} (1) > tools [] (2) > tool {} (3) > function {} (4) > parameters {} (5) > nest.
  auto body = [](int inner) {
    return R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function":)"
           R"( {"name": "f", "parameters": {"a": )" +
           nest(inner) + "}}}]}";
  };
  ParsedRequest ok = parse_request(Api::kChat, body(123));
  ASSERT_EQ(ok.conversation.tools.size(), 1u);
  EXPECT_EQ(json_value_depth(ok.conversation.tools[0].parameters), 124);
  expect_too_deep(Api::kChat, body(124));
}

TEST(JsonDepth, DeepRequestsAreA400InEachApisShape) {
  const std::string deep = nest(100000);
  // The reported crash: a tool whose parameters nest arrays 100,000 deep.
  expect_too_deep(Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": )"
                              R"("function", "function": {"name": "f", "parameters": {"p": )" +
                                  deep + "}}}]}");
  expect_too_deep(Api::kChat, R"({"messages": [{"role": "user", "content": )" + deep + "}]}");
  expect_too_deep(Api::kChat, R"({"messages": [{"role": "user", "content": "x"}], "response_format": )" +
                                  nest_objects(100000) + "}");
  expect_too_deep(Api::kChat, nest_objects(100000));
  expect_too_deep(Api::kResponses, R"({"input": )" + deep + "}");
  expect_too_deep(
      Api::kResponses,
      R"({"input": [{"role": "user", "content": [{"type": "input_text", "text": )" + deep + "}]}]}");
  expect_too_deep(Api::kMessages,
                  R"({"max_tokens": 5, "messages": [{"role": "user", "content": )" + deep + "}]}");
  expect_too_deep(Api::kMessages, R"({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}], )"
                                  R"("tools": [{"name": "f", "input_schema": )" +
                                      nest_objects(100000) + "}]}");
  // Anthropic's error shape.
  try {
    parse_request(Api::kMessages, deep);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.body().at("type"), "error");
    EXPECT_EQ(e.body().at("error").at("type"), "invalid_request_error");
  }
}

// Values parsed elsewhere get the same limit when they reach the adapters.
TEST(JsonDepth, AdaptersCheckParsedValues) {
  J body = {{"messages", J::array({J{{"role", "user"}, {"content", "x"}}})},
            {"tools",
             J::array({J{{"type", "function"},
                         {"function", J{{"name", "f"}, {"parameters", J{{"p", nested_value(100000)}}}}}}})}};
  try {
    parse_chat_request(body);
    ADD_FAILURE();
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
  }
  J msg = {{"max_tokens", 5}, {"messages", J::array({J{{"role", "user"}, {"content", nested_value(300)}}})}};
  EXPECT_THROW(parse_messages_request(msg), ApiError);
  J resp = {{"input", nested_value(300)}};
  EXPECT_THROW(parse_responses_request(resp), ApiError);
}

TEST(JsonDepth, RecursiveSerializersRefuseDeeperValues) {
  EXPECT_EQ(py_json_dumps(nested_value(3)), "[[[]]]");
  EXPECT_NO_THROW(py_json_dumps(nested_value(128)));
  EXPECT_THROW(py_json_dumps(nested_value(129)), Error);
  EXPECT_THROW(py_json_dumps(nested_value(100000)), Error);
}

// Tool-call arguments are a string in the request: JSON inside it that nests deeper than the limit is
// kept as text by the DeepSeek V4 encoder (which re-serializes arguments), not dumped recursively.
TEST(JsonDepth, DeepToolCallArgumentsStringStaysText) {
  Conversation c;
  Message u;
  u.role = Role::kUser;
  u.content.push_back({ContentPart::Kind::kText, "hi", ""});
  Message a;
  a.role = Role::kAssistant;
  ToolCall tc;
  tc.id = "call_1";
  tc.name = "f";
  tc.arguments = "{\"x\": " + nest(100000) + "}";
  a.tool_calls.push_back(tc);
  c.messages = {u, a};
  const std::string out = encode_deepseek_v4(c, false).str();
  EXPECT_NE(out.find("name=\"arguments\" string=\"true\">{\"x\": [[[["), std::string::npos);
  // A shallow object is still expanded into parameters.
  c.messages[1].tool_calls[0].arguments = R"({"x": [[1]]})";
  EXPECT_NE(encode_deepseek_v4(c, false).str().find("name=\"x\" string=\"false\">[[1]]<"), std::string::npos);
}

// A model that writes its arguments before the name, 100,000 deep: the call fails to parse as a call
// (its bytes stay text) instead of recursing through the arguments.
TEST(JsonDepth, DeepModelWrittenToolCallIsNotACall) {
  JsonToolCallReader r;
  JsonToolCallReader::Output out;
  const std::string text = R"({"arguments": )" + nest(100000) + R"(, "name": "f"})";
  EXPECT_EQ(r.feed(text, out), text.size());
  EXPECT_EQ(r.status(), JsonToolCallReader::Status::kFailed);
  EXPECT_FALSE(out.begin);
  JsonToolCallReader ok;
  JsonToolCallReader::Output o2;
  ok.feed(R"({"arguments": [[1]], "name": "f"})", o2);
  EXPECT_TRUE(o2.begin);
  EXPECT_EQ(o2.args, "[[1]]");
}

}  // namespace
}  // namespace beluga::recipe
