// Output parser goldens per format. Every case is also fed one byte at a time and split at every
// position into two chunks: the folded events and the finish reason must be identical.
#include <gtest/gtest.h>

#include "parser_test_support.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/output_parser.h"

namespace beluga::recipe {
namespace {

using K = ParserEvent::Kind;
using test::calls_of;
using test::parse_all_ways;
using test::Result;
using test::text_of;

TEST(OutputParser, DeepSeekV3ToolCalls) {
  ParserOptions o;
  o.tools = ToolSyntax::kV3;
  const std::string text = std::string("Let me check.\n\n") + ds::kCallsBegin + ds::kCallBegin + "function" +
                           ds::kToolSep + "get_weather\n```json\n{\"city\": \"Paris\"}\n```" + ds::kCallEnd +
                           "\n" + ds::kCallBegin + "function" + ds::kToolSep + "get_time\n```json\n{}\n```" +
                           ds::kCallEnd + ds::kCallsEnd;
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(text_of(r, K::kContent), "Let me check.");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].args, nlohmann::json({{"city", "Paris"}}));
  EXPECT_EQ(calls[1].name, "get_time");
  EXPECT_EQ(calls[1].args, nlohmann::json::object());
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(OutputParser, ToolMarkupIsTextWithoutTools) {
  ParserOptions o;  // no tools in the request
  const std::string text = std::string("a") + ds::kCallsBegin + "b";
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(text_of(r, K::kContent), text);
  EXPECT_EQ(r.finish, FinishReason::kStop);
}

TEST(OutputParser, R1Reasoning) {
  ParserOptions o;
  o.start_in_reasoning = true;
  Result r = parse_all_ways(o, "\nLet me think.\nStep 2 — ok 🐳\n\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(text_of(r, K::kReasoning), "Let me think.\nStep 2 — ok 🐳");
  EXPECT_EQ(text_of(r, K::kContent), "The answer is 4.");
  EXPECT_EQ(r.finish, FinishReason::kStop);
}

TEST(OutputParser, V31ThinkingThenToolCall) {
  ParserOptions o;
  o.tools = ToolSyntax::kV31;
  o.start_in_reasoning = true;
  const std::string text = std::string("need data</think>ok") + ds::kCallsBegin + ds::kCallBegin + "f" +
                           ds::kToolSep + "{\"a\": [1, 2], \"s\": \"x\\\"y\"}" + ds::kCallEnd +
                           ds::kCallsEnd + "ignored";
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(text_of(r, K::kReasoning), "need data");
  EXPECT_EQ(text_of(r, K::kContent), "ok");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "f");
  EXPECT_EQ(calls[0].args, nlohmann::json::parse(R"({"a": [1, 2], "s": "x\"y"})"));
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(OutputParser, V4DsmlToolCalls) {
  ParserOptions o;
  o.tools = ToolSyntax::kDsml;
  const std::string D = ds::kDsml;
  const std::string text =
      "I'll look.\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"search\">\n<" + D +
      "parameter name=\"query\" string=\"true\">C++ \"20\"\\new\nline ü</" + D + "parameter>\n<" + D +
      "parameter name=\"limit\" string=\"false\">5</" + D + "parameter>\n<" + D +
      "parameter name=\"opts\" string=\"false\">{\"deep\": true}</" + D + "parameter>\n</" + D +
      "invoke>\n<" + D + "invoke name=\"noargs\">\n</" + D + "invoke>\n</" + D + "tool_calls>trailing junk";
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(text_of(r, K::kContent), "I'll look.");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "search");
  EXPECT_EQ(
      calls[0].args,
      nlohmann::json::parse(R"({"query": "C++ \"20\"\\new\nline ü", "limit": 5, "opts": {"deep": true}})"));
  EXPECT_EQ(calls[1].name, "noargs");
  EXPECT_EQ(calls[1].args, nlohmann::json::object());
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(OutputParser, V41DsmlInsideReasoning) {
  ParserOptions o;
  o.tools = ToolSyntax::kDsml;
  o.start_in_reasoning = true;
  const std::string D = ds::kDsml;
  const std::string text = "plan\n\n<" + D + " calls>\n<" + D + " invoke name=\"run\">\n<" + D +
                           " parameter name=\"cmd\" string=\"true\">ls -l</" + D + " parameter>\n</" + D +
                           " invoke>\n</" + D + " calls>";
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(text_of(r, K::kReasoning), "plan");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "run");
  EXPECT_EQ(calls[0].args, nlohmann::json({{"cmd", "ls -l"}}));
}

TEST(OutputParser, PrefilledToolCallBlock) {
  ParserOptions o;
  o.tools = ToolSyntax::kDsml;
  o.start_in_tool_calls = true;
  const std::string D = ds::kDsml;
  Result r = parse_all_ways(o, "<" + D + "invoke name=\"f\">\n</" + D + "invoke>\n</" + D + "tool_calls>");
  ASSERT_EQ(calls_of(r).size(), 1u);
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(OutputParser, StopSequence) {
  ParserOptions o;
  o.stop = {"STOP", "", "\n\nUser:"};
  Result r = parse_all_ways(o, "Hello ST world STOP more text");
  EXPECT_EQ(text_of(r, K::kContent), "Hello ST world ");
  EXPECT_EQ(r.finish, FinishReason::kStop);
  EXPECT_EQ(r.stop, "STOP");
  Result r2 = parse_all_ways(o, "a\n\nUser: b");
  EXPECT_EQ(text_of(r2, K::kContent), "a");
  EXPECT_EQ(r2.stop, "\n\nUser:");
}

TEST(OutputParser, StopSequencesIgnoredInReasoning) {
  ParserOptions o;
  o.start_in_reasoning = true;
  o.stop = {"X"};
  Result r = parse_all_ways(o, "aXb</think>cXd");
  EXPECT_EQ(text_of(r, K::kReasoning), "aXb");
  EXPECT_EQ(text_of(r, K::kContent), "c");
  EXPECT_EQ(r.stop, "X");
}

TEST(OutputParser, JsonModeBlanksTextOutsideTheValue) {
  ParserOptions o;
  o.json_mode = true;
  Result r = parse_all_ways(o, "Here:\n```json\n{\"a\": [1, \"é\"]}\n```\nbye");
  const std::string content = text_of(r, K::kContent);
  EXPECT_EQ(content, "      {\"a\": [1, \"é\"]}    ");
  EXPECT_EQ(nlohmann::json::parse(content), nlohmann::json::parse(R"({"a": [1, "é"]})"));
  Result raw = parse_all_ways(o, "ok {\"b\": 2}");
  EXPECT_EQ(text_of(raw, K::kContent), "   {\"b\": 2}");
}

TEST(OutputParser, LengthAndUnfinishedMarkers) {
  ParserOptions o;
  o.tools = ToolSyntax::kV3;
  o.stop = {"<END>"};
  // A partial marker at the end is text after all.
  Result r = parse_all_ways(o, "abc <EN", /*length=*/true);
  EXPECT_EQ(text_of(r, K::kContent), "abc <EN");
  EXPECT_EQ(r.finish, FinishReason::kLength);
}

TEST(OutputParser, StrayEndOfThinkingIsDropped) {
  ParserOptions o;
  Result r = parse_all_ways(o, "\n\nanswer</think> more");
  EXPECT_EQ(text_of(r, K::kContent), "answer more");
}

TEST(OutputParser, InvalidUtf8BecomesReplacement) {
  ParserOptions o;
  Result r = parse_all_ways(o, std::string("a\xff"
                                           "b\xe4\xb8"));
  EXPECT_EQ(text_of(r, K::kContent),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(OutputParser, OptionsFollowTheFormat) {
  Conversation c;
  c.thinking = true;
  c.tools = {Tool{"f", "", nlohmann::ordered_json::object()}};
  ParserOptions v4 = parser_options(ChatFormat::kDeepSeekV4, c, {"x"});
  EXPECT_EQ(v4.tools, ToolSyntax::kDsml);
  EXPECT_TRUE(v4.start_in_reasoning);
  EXPECT_EQ(parser_options(ChatFormat::kDeepSeekV3, c, {}).tools, ToolSyntax::kV3);
  EXPECT_TRUE(parser_options(ChatFormat::kDeepSeekR1, c, {}).start_in_reasoning);
  c.tool_choice.mode = ToolChoice::Mode::kNone;
  EXPECT_EQ(parser_options(ChatFormat::kDeepSeekV31, c, {}).tools, ToolSyntax::kNone);
}

}  // namespace
}  // namespace beluga::recipe
