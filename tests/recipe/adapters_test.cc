// API adapters: valid requests map onto the Conversation; invalid ones fail with the API's status
// and error body.
#include <gtest/gtest.h>

#include "recipe/encode_request.h"
#include "recipe/request.h"

namespace beluga::recipe {
namespace {

using J = nlohmann::ordered_json;

// Runs `parse` expecting an ApiError; returns it.
template <typename F>
ApiError expect_error(F&& parse) {
  try {
    parse();
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "expected an ApiError";
  return ApiError(Api::kChat, 0, "none");
}

ApiError chat_error(const std::string& body) {
  return expect_error([&] { parse_request(Api::kChat, body); });
}
ApiError responses_error(const std::string& body) {
  return expect_error([&] { parse_request(Api::kResponses, body); });
}
ApiError messages_error(const std::string& body) {
  return expect_error([&] { parse_request(Api::kMessages, body); });
}

void expect_openai_shape(const ApiError& e, const std::string& param) {
  EXPECT_EQ(e.status(), 400);
  const auto& err = e.body().at("error");
  EXPECT_EQ(err.at("type"), "invalid_request_error");
  EXPECT_TRUE(err.at("message").is_string());
  if (param.empty()) {
    EXPECT_TRUE(err.at("param").is_null()) << e.body().dump();
  } else {
    EXPECT_EQ(err.at("param"), param) << e.body().dump();
  }
}

TEST(ChatAdapter, ValidationErrors) {
  expect_openai_shape(chat_error("{"), "");
  expect_openai_shape(chat_error("[]"), "");
  expect_openai_shape(chat_error("{}"), "messages");
  expect_openai_shape(chat_error(R"({"messages": "hi"})"), "messages");
  expect_openai_shape(chat_error(R"({"messages": []})"), "messages");
  expect_openai_shape(chat_error(R"({"messages": [{"content": "x"}]})"), "messages[0].role");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "wizard", "content": "x"}]})"),
                      "messages[0].role");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "user", "content": 5}]})"), "messages[0].content");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "user"}]})"), "messages[0].content");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "user", "content": [{"type": "audio"}]}]})"),
                      "messages[0].content[0].type");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "tool", "content": "r"}]})"),
                      "messages[0].tool_call_id");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})"),
                      "temperature");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"})"),
                      "temperature");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})"),
                      "max_tokens");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "stop": [1]})"),
                      "stop[0]");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "user", "content": "x"}], "n": 2})"), "n");
  expect_openai_shape(
      chat_error(
          R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}})"),
      "response_format.json_schema");  // json_schema needs its object
                                       // (tests/server/structured_output_test.cc)
  expect_openai_shape(
      chat_error(R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})"),
      "response_format.type");
  expect_openai_shape(
      chat_error(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
      "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})"),
      "tool_choice");
  expect_openai_shape(
      chat_error(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})"),
      "tools[0].function");
  expect_openai_shape(chat_error(R"({"messages": [{"role": "assistant", "content": "a", "prefix": true},
      {"role": "user", "content": "x"}]})"),
                      "messages[0].prefix");
  expect_openai_shape(
      chat_error(R"({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "on"}})"),
      "thinking.type");
}

TEST(ChatAdapter, FullRequest) {
  ParsedRequest r = parse_request(Api::kChat, R"({
    "model": "deepseek-chat", "stream": true, "stream_options": {"include_usage": true},
    "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null, "reasoning_content": "think",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "42"},
      {"role": "assistant", "content": "The answer", "prefix": true}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d",
               "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}],
    "tool_choice": "required", "thinking": {"type": "enabled"}, "reasoning_effort": "medium",
    "response_format": {"type": "json_object"}, "stop": "END", "max_tokens": 100,
    "temperature": 0.5, "top_p": 0.9, "top_k": 40, "seed": 7})");
  const Conversation& c = r.conversation;
  EXPECT_EQ(r.model, "deepseek-chat");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  ASSERT_EQ(c.messages.size(), 5u);
  EXPECT_EQ(c.messages[0].role, Role::kSystem);
  EXPECT_EQ(c.messages[1].text(), "Hi there");
  EXPECT_EQ(c.messages[2].reasoning, "think");
  ASSERT_EQ(c.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(c.messages[2].tool_calls[0].arguments, "{\"x\": 1}");
  EXPECT_EQ(c.messages[3].tool_call_id, "c1");
  EXPECT_TRUE(c.messages[4].prefix);
  ASSERT_EQ(c.tools.size(), 1u);
  EXPECT_EQ(c.tools[0].parameters.dump(), R"({"type":"object","properties":{"x":{"type":"integer"}}})");
  EXPECT_EQ(c.tool_choice.mode, ToolChoice::Mode::kRequired);
  EXPECT_TRUE(c.thinking);
  EXPECT_EQ(c.effort, Effort::kHigh);
  EXPECT_TRUE(c.json_mode);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.max_tokens, 100);
  EXPECT_EQ(r.sampling.temperature, 0.5);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.seed, 7);
}

TEST(ResponsesAdapter, ValidationErrors) {
  expect_openai_shape(responses_error("{}"), "input");
  expect_openai_shape(responses_error(R"({"input": 3})"), "input");
  expect_openai_shape(responses_error(R"({"input": [{"type": "message", "role": "user"}]})"),
                      "input[0].content");
  expect_openai_shape(responses_error(R"({"input": [{"type": "mystery"}]})"), "input[0].type");
  expect_openai_shape(responses_error(R"({"input": "x", "previous_response_id": 5})"),
                      "previous_response_id");
  expect_openai_shape(responses_error(R"({"input": "x", "tools": [{"type": "file_search"}]})"),
                      "tools[0].type");
  expect_openai_shape(responses_error(R"({"input": "x", "reasoning": {"effort": "extreme"}})"),
                      "reasoning.effort");
}

TEST(ResponsesAdapter, ItemsToConversation) {
  ParsedRequest r = parse_request(Api::kResponses, R"({
    "model": "m", "instructions": "Sys",
    "input": [
      {"role": "user", "content": "Weather?"},
      {"type": "reasoning", "summary": [{"type": "summary_text", "text": "need tool"}]},
      {"type": "function_call", "call_id": "c1", "name": "w", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
      {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]}],
    "tools": [{"type": "web_search"}, {"type": "function", "name": "w", "parameters": {"type": "object"}}],
    "reasoning": {"effort": "none"}, "text": {"format": {"type": "json_object"}}, "max_output_tokens": 50})");
  const Conversation& c = r.conversation;
  ASSERT_EQ(c.messages.size(), 6u);
  EXPECT_EQ(c.messages[0].text(), "Sys");
  EXPECT_EQ(c.messages[2].role, Role::kAssistant);
  EXPECT_EQ(c.messages[2].reasoning, "need tool");
  ASSERT_EQ(c.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(c.messages[3].role, Role::kTool);
  EXPECT_EQ(c.messages[3].text(), "sunny");
  EXPECT_EQ(c.messages[4].text(), "Sunny.");
  ASSERT_EQ(c.tools.size(), 1u);  // web_search dropped
  EXPECT_FALSE(c.thinking);
  EXPECT_TRUE(c.json_mode);
  EXPECT_EQ(r.max_tokens, 50);
}

void expect_anthropic_shape(const ApiError& e, const std::string& message_start) {
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.body().at("type"), "error");
  EXPECT_EQ(e.body().at("error").at("type"), "invalid_request_error");
  EXPECT_TRUE(e.body().at("error").at("message").get<std::string>().starts_with(message_start))
      << e.body().dump();
  EXPECT_FALSE(e.body().contains("param"));
}

TEST(MessagesAdapter, ValidationErrors) {
  expect_anthropic_shape(messages_error("nope"), "the request body is not valid JSON");
  expect_anthropic_shape(messages_error(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})"),
                         "max_tokens: Field required");
  expect_anthropic_shape(messages_error(R"({"max_tokens": 5, "messages": []})"), "model: Field required");
  expect_anthropic_shape(messages_error(R"({"model": "m", "max_tokens": 5, "messages": []})"), "messages:");
  expect_anthropic_shape(
      messages_error(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})"),
      "messages[0].role:");
  expect_anthropic_shape(
      messages_error(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]})"),
      "tools[0].type: server tools are not supported");
  expect_anthropic_shape(messages_error(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user",
      "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]})"),
                         "messages[0].content[0].type:");
  expect_anthropic_shape(
      messages_error(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}],
      "temperature": 1.5})"),
      "temperature:");
}

TEST(MessagesAdapter, BlocksToConversation) {
  ParsedRequest r = parse_request(Api::kMessages, R"({
    "model": "claude-x", "max_tokens": 2048, "system": [{"type": "text", "text": "Sys"}],
    "messages": [
      {"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                        {"type": "text", "text": "Checking."},
                                        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Oslo", "n": 1}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "cold"}]},
                                   {"type": "text", "text": "And tomorrow?"}]}],
    "tools": [{"name": "w", "description": "weather", "input_schema": {"type": "object"}}],
    "tool_choice": {"type": "any"}, "thinking": {"type": "enabled", "budget_tokens": 1024},
    "stop_sequences": ["\n\nHuman:"], "top_k": 5})");
  const Conversation& c = r.conversation;
  ASSERT_EQ(c.messages.size(), 5u);
  EXPECT_EQ(c.messages[0].role, Role::kSystem);
  EXPECT_EQ(c.messages[2].reasoning, "hmm");
  EXPECT_EQ(c.messages[2].text(), "Checking.");
  ASSERT_EQ(c.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(c.messages[2].tool_calls[0].arguments, R"({"city": "Oslo", "n": 1})");
  EXPECT_EQ(c.messages[3].role, Role::kTool);
  EXPECT_EQ(c.messages[3].tool_call_id, "t1");
  EXPECT_EQ(c.messages[3].text(), "cold");
  EXPECT_EQ(c.messages[4].text(), "And tomorrow?");
  EXPECT_EQ(c.tool_choice.mode, ToolChoice::Mode::kRequired);
  EXPECT_TRUE(c.thinking);
  EXPECT_EQ(r.max_tokens, 2048);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n\nHuman:"});
}

TEST(EncodeRequest, ImagesForATextOnlyFormatAreA400) {
  ParsedRequest r =
      parse_request(Api::kMessages, R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user",
      "content": [{"type": "image", "source": {"type": "url", "url": "http://x/cat.png"}}]}]})");
  ApiError e = expect_error([&] { encode_request(ChatEncoder(ChatFormat::kDeepSeekV3), r); });
  EXPECT_EQ(e.status(), 400);
  EXPECT_EQ(e.body().at("type"), "error");
  EXPECT_NE(e.body().at("error").at("message").get<std::string>().find("image"), std::string::npos);
}

}  // namespace
}  // namespace beluga::recipe
