// JSON tool calls of chat-template models through the output parser: Hermes `<tool_call>` blocks
// (Qwen2.5 / Qwen3) and Llama 3.x JSON replies. Every case is parsed whole, byte by byte and split in
// two at every position (parse_all_ways): the folded events must agree.
#include <gtest/gtest.h>

#include "parser_test_support.h"
#include "recipe/json_tool_call.h"
#include "recipe/output_parser.h"

namespace beluga::recipe {
namespace {

using test::calls_of;
using test::K;
using test::parse_all_ways;
using test::Result;
using test::text_of;

ParserOptions hermes() {
  ParserOptions o;
  o.tools = ToolSyntax::kHermes;
  return o;
}

ParserOptions llama() {
  ParserOptions o;
  o.tools = ToolSyntax::kLlama3Json;
  return o;
}

std::string block(const std::string& json) {
  return "<tool_call>\n" + json + "\n</tool_call>";
}

// One get_weather call for Paris and nothing else; the arguments are the model's text, as written.
void expect_paris_weather_call(const Result& r) {
  EXPECT_EQ(text_of(r, K::kContent), "");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].text, R"({"city": "Paris"})");
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(HermesParser, SingleCall) {
  expect_paris_weather_call(
      parse_all_ways(hermes(), block(R"({"name": "get_weather", "arguments": {"city": "Paris"}})")));
}

TEST(HermesParser, ContentThenSeveralCalls) {
  const std::string text = "Let me check both cities.\n\n" +
                           block(R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C"}})") +
                           "\n" + block(R"({"name": "get_time", "arguments": {}})") + "\n";
  Result r = parse_all_ways(hermes(), text);
  EXPECT_EQ(text_of(r, K::kContent), "Let me check both cities.");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].args, nlohmann::json::parse(R"({"city": "Paris", "unit": "°C"})"));
  EXPECT_EQ(calls[1].name, "get_time");
  EXPECT_EQ(calls[1].args, nlohmann::json::object());
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(HermesParser, ArgumentsStreamBeforeTheBlockCloses) {
  // Braces, quotes and `</` inside strings do not end the arguments; nested values stream verbatim.
  const std::string args = R"({"code": "if (a) { b(\"}\"); } </div>", "n": [1, {"x": null}], "s": "🐳"})";
  const std::string text = block(R"({"name": "run", "arguments": )" + args + "}");
  Result r = parse_all_ways(hermes(), text);
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].text, args);

  // Fed up to the middle of the arguments, the call has begun and its arguments are under way.
  OutputParser p(hermes());
  std::vector<ParserEvent> ev;
  const size_t mid = text.find("b(");
  for (size_t i = 0; i < mid; ++i) p.feed(text.substr(i, 1), ev);
  ev = test::fold(ev);
  ASSERT_GE(ev.size(), 2u);
  EXPECT_EQ(ev[0], (ParserEvent{K::kToolCallBegin, "run", 0}));
  EXPECT_EQ(ev[1].kind, K::kToolCallArgs);
  EXPECT_TRUE(args.starts_with(ev[1].text));
  EXPECT_GE(ev[1].text.size(), std::string(R"({"code": "if (a) { )").size());
}

TEST(HermesParser, MalformedBlocksAreContent) {
  for (const std::string& inner : {
           std::string("not json at all"),
           std::string(R"({"name": get_weather, "arguments": {}})"),  // unquoted name
           std::string(R"({"name": "f"})"),                           // no arguments
           std::string(R"({"arguments": {"a": 1}})"),                 // no name
           std::string(R"({"name": "", "arguments": {}})"),           // empty name
           std::string(R"(["f", {}])"),
       }) {
    SCOPED_TRACE(inner);
    const std::string text = "Answer: " + block(inner) + " done";
    Result r = parse_all_ways(hermes(), text);
    EXPECT_EQ(text_of(r, K::kContent), text);  // as written, nothing dropped
    EXPECT_TRUE(calls_of(r).empty());
    EXPECT_EQ(r.finish, FinishReason::kStop);
  }
}

TEST(HermesParser, MalformedBlockThenCall) {
  const std::string bad = block("I will call get_weather");
  const std::string text = bad + "\n" + block(R"({"name": "get_weather", "arguments": {"city": "Oslo"}})");
  Result r = parse_all_ways(hermes(), text);
  EXPECT_EQ(text_of(r, K::kContent), bad);
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].args, nlohmann::json({{"city", "Oslo"}}));
}

TEST(HermesParser, DoubledOpenerStillCalls) {
  // The first `<tool_call>` is not followed by JSON: it is text, and the second one opens the call.
  Result r = parse_all_ways(hermes(), "<tool_call>" + block(R"({"name": "f", "arguments": {"a": 1}})"));
  EXPECT_EQ(text_of(r, K::kContent), "<tool_call>");
  ASSERT_EQ(calls_of(r).size(), 1u);
}

TEST(HermesParser, MissingCloseTagBetweenCalls) {
  Result r = parse_all_ways(hermes(), R"(<tool_call>
{"name": "a", "arguments": {}}
<tool_call>
{"name": "b", "arguments": {"x": 1}}
</tool_call>)");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].name, "b");
  EXPECT_EQ(text_of(r, K::kContent), "");
}

TEST(HermesParser, UnfinishedBlocksInARow) {
  // The first opener is text; the second block never got its arguments: text as well.
  const std::string text = "<tool_call><tool_call>{\"name\": \"f\"";
  Result r = parse_all_ways(hermes(), text);
  EXPECT_EQ(text_of(r, K::kContent), text);
  EXPECT_TRUE(calls_of(r).empty());
}

TEST(HermesParser, UnusualKeyOrderIsDecidedWhole) {
  // Arguments before the name, and arguments as a JSON string: not streamed, but still calls.
  Result r = parse_all_ways(hermes(), block(R"({"arguments": {"q": "x"}, "name": "search"})") +
                                          block(R"({"name": "f", "arguments": "{\"a\": 2}"})"));
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "search");
  EXPECT_EQ(calls[0].args, nlohmann::json({{"q", "x"}}));
  EXPECT_EQ(calls[1].args, nlohmann::json({{"a", 2}}));
}

TEST(HermesParser, UnclosedBlocks) {
  // The model stopped after the JSON (no `</tool_call>`): still a call.
  Result r =
      parse_all_ways(hermes(), "<tool_call>\n" + std::string(R"({"name": "f", "arguments": {"a": 1}})"));
  ASSERT_EQ(calls_of(r).size(), 1u);
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
  // Stopped before the arguments began: text.
  const std::string partial = "ok <tool_call>\n{\"name\": \"f\"";
  Result t = parse_all_ways(hermes(), partial);
  EXPECT_EQ(text_of(t, K::kContent), partial);
  EXPECT_TRUE(calls_of(t).empty());
}

TEST(HermesParser, TextAfterTheArgumentsIsIgnoredAndContentResumes) {
  Result r = parse_all_ways(
      hermes(), block(R"({"name": "f", "arguments": {"a": 1}, "id": 7} junk)") + "\n\nI called f.");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].text, R"({"a": 1})");
  EXPECT_EQ(text_of(r, K::kContent), "I called f.");
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(HermesParser, MarkupIsTextWithoutTools) {
  const std::string text = "Use " + block(R"({"name": "f", "arguments": {}})");
  Result r = parse_all_ways(ParserOptions{}, text);
  EXPECT_EQ(text_of(r, K::kContent), text);
  EXPECT_EQ(r.finish, FinishReason::kStop);
}

TEST(HermesParser, Qwen3ThinkingThenCall) {
  ParserOptions o = hermes();
  o.think_tags = true;
  // A `<tool_call>` mentioned while thinking is reasoning (Qwen closes `</think>` before calling).
  const std::string text = "<think>\nI should emit <tool_call> for the weather.\n</think>\n\n" +
                           block(R"({"name": "get_weather", "arguments": {"city": "Rome"}})");
  Result r = parse_all_ways(o, text);
  EXPECT_EQ(text_of(r, K::kReasoning), "I should emit <tool_call> for the weather.");
  EXPECT_EQ(text_of(r, K::kContent), "");
  ASSERT_EQ(calls_of(r).size(), 1u);
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(Llama3JsonParser, SingleCall) {
  expect_paris_weather_call(
      parse_all_ways(llama(), R"({"name": "get_weather", "parameters": {"city": "Paris"}})"));
}

TEST(Llama3JsonParser, PythonTagAndArguments) {
  Result r = parse_all_ways(llama(), R"(<|python_tag|>{"name": "f", "arguments": {"x": [1, 2]}})");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "f");
  EXPECT_EQ(calls[0].args, nlohmann::json::parse(R"({"x": [1, 2]})"));
}

TEST(Llama3JsonParser, SemicolonSeparatedCalls) {
  Result r = parse_all_ways(llama(),
                            "\n"
                            R"({"name": "a", "parameters": {"i": 1}}; {"name": "b", "parameters": {}};)"
                            R"({"type": "function", "name": "c", "parameters": {"s": "x;y"}})");
  auto calls = calls_of(r);
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].name, "a");
  EXPECT_EQ(calls[0].args, nlohmann::json({{"i", 1}}));
  EXPECT_EQ(calls[1].name, "b");
  EXPECT_EQ(calls[2].name, "c");  // Llama 3.2 writes "type" first
  EXPECT_EQ(calls[2].args, nlohmann::json({{"s", "x;y"}}));
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(Llama3JsonParser, EndOfMessageAfterTheCallsStops) {
  OutputParser p(llama());
  std::vector<ParserEvent> ev;
  p.feed(R"({"name": "f", "parameters": {}})", ev);
  EXPECT_FALSE(p.done());  // a `;` and another call may follow
  p.feed("<|eom_id|>more", ev);
  EXPECT_TRUE(p.done());
  EXPECT_EQ(p.finish(false, ev), FinishReason::kToolCalls);
  for (const auto& e : ev) EXPECT_NE(e.kind, K::kContent);
}

TEST(Llama3JsonParser, JsonThatIsNotACallIsContent) {
  for (const std::string& text : {
           std::string(R"({"answer": 42, "unit": "km"})"),
           std::string(R"({"name": "Ada Lovelace", "born": 1815})"),  // a name, but no parameters
           std::string(R"(<|python_tag|>brave_search.call(query="weather"))"),
           std::string(R"(Here you go: {"name": "f", "parameters": {}})"),  // a call is the whole reply
           std::string(R"({"name": "f", "parameters": {"a": 1})"),          // cut short: the call holds
       }) {
    SCOPED_TRACE(text);
    Result r = parse_all_ways(llama(), text);
    if (text.ends_with(R"({"a": 1})")) {
      ASSERT_EQ(calls_of(r).size(), 1u);
      continue;
    }
    EXPECT_EQ(text_of(r, K::kContent), text);
    EXPECT_TRUE(calls_of(r).empty());
    EXPECT_EQ(r.finish, FinishReason::kStop);
  }
}

TEST(Llama3JsonParser, PlainJsonWithoutToolsIsContent) {
  // No tools in the request: a reply that looks exactly like a call is still the answer.
  const std::string text = R"({"name": "get_weather", "parameters": {"city": "Paris"}})";
  Result r = parse_all_ways(ParserOptions{}, text);
  EXPECT_EQ(text_of(r, K::kContent), text);
  EXPECT_EQ(r.finish, FinishReason::kStop);
}

TEST(Llama3JsonParser, BadSecondCallIsContent) {
  Result r = parse_all_ways(llama(), R"({"name": "a", "parameters": {}}; oops)");
  ASSERT_EQ(calls_of(r).size(), 1u);
  EXPECT_EQ(text_of(r, K::kContent), " oops");
}

TEST(JsonToolCallParser, ReaderReportsNameOnlyOnceArgumentsBegin) {
  JsonToolCallReader rd;
  JsonToolCallReader::Output out;
  const std::string text = R"( {"name": "f", "arguments": {"a": 1}} tail)";
  size_t n = rd.feed(std::string_view(text).substr(0, 14), out);
  EXPECT_EQ(n, 14u);
  EXPECT_FALSE(out.begin);  // the name is known, but the object may still fail
  n += rd.feed(std::string_view(text).substr(n), out);
  EXPECT_TRUE(out.begin);
  EXPECT_EQ(out.name, "f");
  EXPECT_EQ(out.args, R"({"a": 1})");
  EXPECT_EQ(rd.status(), JsonToolCallReader::Status::kDone);
  EXPECT_EQ(text.substr(n), " tail");  // stops after the closing brace
}

TEST(JsonToolCallParser, ReaderFailureKeepsTheBytesRead) {
  JsonToolCallReader rd;
  JsonToolCallReader::Output out;
  const std::string text = R"({"name": 5})";
  const size_t n = rd.feed(text, out);
  EXPECT_EQ(rd.status(), JsonToolCallReader::Status::kFailed);
  EXPECT_EQ(rd.raw(), text.substr(0, n));
  EXPECT_FALSE(out.begin);
}

}  // namespace
}  // namespace beluga::recipe
