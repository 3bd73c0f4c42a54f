// Responses `previous_response_id` at the prompt level: a request continuing a stored response (its
// conversation handed in as ParseOptions::previous_items, as the server's store does) renders the
// same prompt as the whole conversation sent explicitly, with only the new request's instructions.
#include <gtest/gtest.h>

#include "recipe/chat_format.h"
#include "recipe/request.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace beluga::recipe {
namespace {

using J = nlohmann::ordered_json;

using test::kDemoModel;

const J kTools = J::parse(R"([{"type": "function", "name": "get_weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}])");

// The first request's input items and what the server stored of its output (the response's
// `output` items verbatim: reasoning, then a function call).
const J kFirstInput = responses_input_items("What is the weather in Paris?");
const J kFirstOutput = J::parse(R"([
  {"id": "rs_1", "type": "reasoning", "summary": [],
   "content": [{"type": "reasoning_text", "text": "I should call the tool."}], "status": "completed"},
  {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
   "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}])");
const J kFollowUp =
    J::parse(R"([{"type": "function_call_output", "call_id": "call_1", "output": "{\"temp_c\": 21}"}])");

J concat(std::initializer_list<J> parts) {
  J out = J::array();
  for (const J& p : parts)
    for (const J& it : p) out.push_back(it);
  return out;
}

TEST(ResponsesChain, ContinuedRequestRendersLikeTheExplicitConversation) {
  const tok::Tokenizer tok = tok::Tokenizer::from_file(kDemoModel + "/tokenizer.json");
  ParseOptions chained_opt;
  chained_opt.previous_items = concat({kFirstInput, kFirstOutput});
  const J chained{{"model", "m"},
                  {"instructions", "Answer in French."},
                  {"previous_response_id", "resp_1"},
                  {"tools", kTools},
                  {"input", kFollowUp}};
  const J explicit_body{{"model", "m"},
                        {"instructions", "Answer in French."},
                        {"tools", kTools},
                        {"input", concat({kFirstInput, kFirstOutput, kFollowUp})}};
  const ParsedRequest a = parse_responses_request(chained, chained_opt);
  const ParsedRequest b = parse_responses_request(explicit_body);
  EXPECT_EQ(a.previous_response_id, "resp_1");
  ASSERT_EQ(a.conversation.messages.size(), 4u);  // instructions, user, assistant call, tool output
  EXPECT_EQ(a.conversation.messages[2].reasoning, "I should call the tool.");
  ASSERT_EQ(a.conversation.messages[2].tool_calls.size(), 1u);
  EXPECT_EQ(a.conversation.messages[3].tool_call_id, "call_1");
  for (const ChatFormat f :
       {ChatFormat::kDeepSeekV3, ChatFormat::kDeepSeekV31, ChatFormat::kDeepSeekV4, ChatFormat::kTemplate}) {
    const ChatEncoder enc =
        f == ChatFormat::kTemplate ? ChatEncoder::from_model_dir(kDemoModel, f) : ChatEncoder(f);
    const Prompt pa = enc.encode(a.conversation), pb = enc.encode(b.conversation);
    EXPECT_EQ(pa.str(), pb.str()) << chat_format_name(f);
    EXPECT_EQ(pa.ids(tok), pb.ids(tok)) << chat_format_name(f);
    EXPECT_NE(pa.str().find("temp_c"), std::string::npos) << pa.str();
    EXPECT_NE(pa.str().find("get_weather"), std::string::npos) << pa.str();
  }
}

TEST(ResponsesChain, InstructionsOfThePreviousResponseAreNotCarried) {
  // Stored conversations never hold instructions (they live on the response object), so only the
  // new request's instructions lead the conversation.
  ParseOptions opt;
  opt.previous_items = concat({kFirstInput, kFirstOutput});
  const ParsedRequest r = parse_responses_request(
      J{{"previous_response_id", "resp_1"}, {"input", kFollowUp}, {"tools", kTools}}, opt);
  ASSERT_FALSE(r.conversation.messages.empty());
  EXPECT_EQ(r.conversation.messages[0].role, Role::kUser);
  EXPECT_EQ(r.conversation.messages[0].text(), "What is the weather in Paris?");
}

TEST(ResponsesChain, UnknownPreviousResponseIs404) {
  try {
    parse_request(Api::kResponses, R"({"input": "x", "previous_response_id": "resp_nope"})");
    FAIL() << "expected an ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 404);
    const auto& err = e.body().at("error");
    EXPECT_EQ(err.at("message"), "Previous response with id 'resp_nope' not found.");
    EXPECT_EQ(err.at("param"), "previous_response_id");
    EXPECT_EQ(err.at("code"), "previous_response_not_found");
    EXPECT_EQ(err.at("type"), "not_found_error");
  }
}

TEST(ResponsesChain, StoreFlagAndInputItems) {
  EXPECT_TRUE(parse_request(Api::kResponses, R"({"input": "x"})").store);  // OpenAI's default
  EXPECT_FALSE(parse_request(Api::kResponses, R"({"input": "x", "store": false})").store);
  try {
    parse_request(Api::kResponses, R"({"input": "x", "store": "no"})");
    FAIL() << "expected an ApiError";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.body().at("error").at("param"), "store");
  }
  // A string input is one user message; either form parses to the same conversation.
  const J items = responses_input_items("hello");
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0]["role"], "user");
  const ParsedRequest a = parse_responses_request(J{{"input", "hello"}});
  const ParsedRequest b = parse_responses_request(J{{"input", items}});
  ASSERT_EQ(a.conversation.messages.size(), 1u);
  ASSERT_EQ(b.conversation.messages.size(), 1u);
  EXPECT_EQ(a.conversation.messages[0].text(), b.conversation.messages[0].text());
  EXPECT_EQ(responses_input_items(items), items);
}

}  // namespace
}  // namespace beluga::recipe
