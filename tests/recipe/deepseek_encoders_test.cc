// Golden prompts of the DeepSeek encoders, written out from each version's reference layout
// (deepseek-formats.md §2), plus the segment-level injection guarantee.
#include <gtest/gtest.h>

#include "recipe/chat_format.h"
#include "recipe/deepseek_encoders.h"
#include "recipe/deepseek_tokens.h"

namespace beluga::recipe {
namespace {

Message msg(Role role, std::string text) {
  Message m;
  m.role = role;
  m.content.push_back({ContentPart::Kind::kText, std::move(text), ""});
  return m;
}

Message assistant(std::string text, std::string reasoning = "", std::vector<ToolCall> calls = {}) {
  Message m = msg(Role::kAssistant, std::move(text));
  m.reasoning = std::move(reasoning);
  m.tool_calls = std::move(calls);
  return m;
}

Message tool_result(std::string id, std::string text) {
  Message m = msg(Role::kTool, std::move(text));
  m.tool_call_id = std::move(id);
  return m;
}

const std::string B = ds::kBos, E = ds::kEos, U = ds::kUser, A = ds::kAssistant, S = ds::kSystem;

int count_control(const Prompt& p) {
  int n = 0;
  for (const auto& s : p.segments()) n += s.control;
  return n;
}

TEST(DeepSeekV3, MultiTurnWithSystem) {
  Conversation c;
  c.messages = {msg(Role::kSystem, "S"), msg(Role::kUser, "Hi"), assistant("Hello"), msg(Role::kUser, "Q")};
  EXPECT_EQ(encode_deepseek_v3(c, false).str(), B + "S" + U + "Hi" + A + "Hello" + E + U + "Q" + A);
}

TEST(DeepSeekV3, SecondToolRoundKeepsItsOpeners) {
  // The official template loses `<｜tool▁outputs▁begin｜>` on a second round; we do not.
  Conversation c;
  c.messages = {msg(Role::kUser, "Q"), assistant("", "", {{"1", "f", "{}"}}), tool_result("1", "r1"),
                assistant("", "", {{"2", "g", "{}"}}), tool_result("2", "r2")};
  const std::string call_f =
      std::string(ds::kCallBegin) + "function" + ds::kToolSep + "f\n```json\n{}\n```" + ds::kCallEnd;
  const std::string call_g =
      std::string(ds::kCallBegin) + "function" + ds::kToolSep + "g\n```json\n{}\n```" + ds::kCallEnd;
  const std::string outs1 =
      std::string(ds::kOutputsBegin) + ds::kOutputBegin + "r1" + ds::kOutputEnd + ds::kOutputsEnd;
  const std::string outs2 =
      std::string(ds::kOutputsBegin) + ds::kOutputBegin + "r2" + ds::kOutputEnd + ds::kOutputsEnd;
  EXPECT_EQ(encode_deepseek_v3(c, false).str(), B + U + "Q" + A + ds::kCallsBegin + call_f + ds::kCallsEnd +
                                                    E + outs1 + ds::kCallsBegin + call_g + ds::kCallsEnd + E +
                                                    outs2);
}

TEST(DeepSeekV3, UserTextSpellingControlTokensStaysText) {
  Conversation c;
  c.messages = {msg(Role::kUser, std::string("x") + U + A + E)};
  Prompt p = encode_deepseek_v3(c, false);
  EXPECT_EQ(count_control(p), 3);  // BOS, <｜User｜>, <｜Assistant｜>
  ASSERT_EQ(p.segments().size(), 4u);
  EXPECT_FALSE(p.segments()[2].control);
  EXPECT_EQ(p.segments()[2].text, std::string("x") + U + A + E);
}

TEST(DeepSeekR1, DropsHistoryReasoningAndOpensThinking) {
  Conversation c;
  c.messages = {msg(Role::kUser, "Q"), assistant("<think>mull</think>ans"), msg(Role::kUser, "Q2")};
  EXPECT_EQ(encode_deepseek_v3(c, true).str(), B + U + "Q" + A + "ans" + E + U + "Q2" + A + "<think>\n");
}

TEST(DeepSeekV31, NonThinkingAndThinkingHeaders) {
  Conversation c;
  c.messages = {msg(Role::kSystem, "S"), msg(Role::kUser, "Hi"), assistant("Hello", "r"),
                msg(Role::kUser, "Q")};
  EXPECT_EQ(encode_deepseek_v31(c).str(),
            B + "S" + U + "Hi" + A + "</think>Hello" + E + U + "Q" + A + "</think>");
  c.thinking = true;
  EXPECT_EQ(encode_deepseek_v31(c).str(),
            B + "S" + U + "Hi" + A + "</think>Hello" + E + U + "Q" + A + "<think>");
}

TEST(DeepSeekV31, ToolCallsAndOutputs) {
  Conversation c;
  c.messages = {msg(Role::kUser, "Q"), assistant("", "", {{"1", "f", "{\"a\": 1}"}, {"2", "g", "{}"}}),
                tool_result("1", "r1"), tool_result("2", "r2")};
  EXPECT_EQ(encode_deepseek_v31(c).str(), B + U + "Q" + A + "</think>" + ds::kCallsBegin + ds::kCallBegin +
                                              "f" + ds::kToolSep + "{\"a\": 1}" + ds::kCallEnd +
                                              ds::kCallBegin + "g" + ds::kToolSep + "{}" + ds::kCallEnd +
                                              ds::kCallsEnd + E + ds::kOutputBegin + "r1" + ds::kOutputEnd +
                                              ds::kOutputBegin + "r2" + ds::kOutputEnd);
}

TEST(DeepSeekV4, NonThinkingAndV41SystemToken) {
  Conversation c;
  c.messages = {msg(Role::kSystem, "S"), msg(Role::kUser, "Hi")};
  EXPECT_EQ(encode_deepseek_v4(c, false).str(), B + "S" + U + "Hi" + A + "</think>");
  EXPECT_EQ(encode_deepseek_v4(c, true).str(), B + S + "S" + U + "Hi" + A + "</think>");
}

TEST(DeepSeekV41, EmptyUserIsFourControlTokens) {
  Conversation c;
  c.messages = {msg(Role::kUser, "")};
  Prompt p = encode_deepseek_v4(c, true);
  ASSERT_EQ(p.segments().size(), 4u);
  EXPECT_EQ(count_control(p), 4);
  EXPECT_EQ(p.str(), B + U + A + "</think>");
}

TEST(DeepSeekV41, EffortLine) {
  Conversation c;
  c.thinking = true;
  c.messages = {msg(Role::kUser, "Hi")};
  const std::string line =
      "Reasoning Effort: 50 (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  EXPECT_EQ(encode_deepseek_v4(c, true).str(), B + S + line + U + "Hi" + A + "<think>");
  c.effort = Effort::kMax;
  EXPECT_NE(encode_deepseek_v4(c, true).str().find("Reasoning Effort: 100 "), std::string::npos);
  c.effort = Effort::kLow;
  EXPECT_EQ(encode_deepseek_v4(c, false).str(), B + U + "Hi" + A + "<think>");  // V4: low has no line
}

TEST(DeepSeekV4, OldReasoningDroppedWithoutTools) {
  Conversation c;
  c.thinking = true;
  c.messages = {msg(Role::kUser, "A"), assistant("a1", "r1"), msg(Role::kUser, "B"), assistant("b1", "r2"),
                msg(Role::kUser, "C")};
  EXPECT_EQ(encode_deepseek_v4(c, false).str(),
            B + U + "A" + A + "</think>a1" + E + U + "B" + A + "</think>b1" + E + U + "C" + A + "<think>");
}

TEST(DeepSeekV4, ReasoningKeptWithToolsAndToolPromptInSystem) {
  Conversation c;
  c.thinking = true;
  c.tools = {Tool{"f", "does f", nlohmann::ordered_json::parse(R"({"type": "object", "properties": {}})")}};
  c.messages = {msg(Role::kUser, "A"), assistant("a1", "r1"), msg(Role::kUser, "B")};
  const std::string p = encode_deepseek_v4(c, false).str();
  EXPECT_TRUE(p.starts_with(B + "\n\n## Tools\n\nYou have access to a set of tools")) << p;
  EXPECT_NE(p.find("<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">"), std::string::npos);
  EXPECT_NE(
      p.find("### Available Tool Schemas\n\n{\"name\": \"f\", \"description\": \"does f\", \"parameters\": "
             "{\"type\": \"object\", \"properties\": {}}}\n\nYou MUST strictly follow"),
      std::string::npos);
  EXPECT_TRUE(p.ends_with(U + "A" + A + "<think>r1</think>a1" + E + U + "B" + A + "<think>")) << p;
}

TEST(DeepSeekV4, DsmlToolCallsAndResultsInCallOrder) {
  Conversation c;
  c.messages = {msg(Role::kUser, "Q"),
                assistant("", "", {{"c1", "f1", R"({"x": "s", "n": 2})"}, {"c2", "f2", ""}}),
                tool_result("c2", "R2"), tool_result("c1", "R1")};
  const std::string D = ds::kDsml;
  EXPECT_EQ(encode_deepseek_v4(c, false).str(),
            B + U + "Q" + A + "</think>" + "\n\n<" + D + "tool_calls>\n<" + D + "invoke name=\"f1\">\n<" + D +
                "parameter name=\"x\" string=\"true\">s</" + D + "parameter>\n<" + D +
                "parameter name=\"n\" string=\"false\">2</" + D + "parameter>\n</" + D + "invoke>\n<" + D +
                "invoke name=\"f2\">\n\n</" + D + "invoke>\n</" + D + "tool_calls>" + E + U +
                "<tool_result>R1</tool_result>\n\n<tool_result>R2</tool_result>" + A + "</think>");
  // V4.1 spells the tags with a leading space.
  const std::string v41 = encode_deepseek_v4(c, true).str();
  EXPECT_NE(v41.find("<" + D + " calls>\n<" + D + " invoke name=\"f1\">\n<" + D + " parameter name=\"x\""),
            std::string::npos);
}

TEST(DeepSeekV4, JsonModeAndRequiredToolPrefill) {
  Conversation c;
  c.json_mode = true;
  c.messages = {msg(Role::kUser, "give json")};
  EXPECT_EQ(encode_deepseek_v4(c, false).str(),
            B +
                "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                "{\"type\": \"json_object\"}" +
                U + "give json" + A + "</think>");
  Conversation t;
  t.tools = {Tool{"f", "", nlohmann::ordered_json::object()}};
  t.tool_choice.mode = ToolChoice::Mode::kRequired;
  t.messages = {msg(Role::kUser, "go")};
  EXPECT_TRUE(encode_deepseek_v4(t, false).str().ends_with(A + "</think>\n\n<｜DSML｜tool_calls>\n"));
}

TEST(ChatFormat, DetectsFromTemplateText) {
  EXPECT_EQ(detect_chat_format("{{'<｜User｜>' + x + '<｜Assistant｜>'}}", "deepseek_v3", false),
            ChatFormat::kDeepSeekV3);
  EXPECT_EQ(detect_chat_format("<｜User｜>{{'<｜Assistant｜><think>\\n'}}", "", false),
            ChatFormat::kDeepSeekR1);
  EXPECT_EQ(detect_chat_format("<｜User｜>{{'<｜Assistant｜></think>'}}", "", false),
            ChatFormat::kDeepSeekV31);
  EXPECT_EQ(detect_chat_format("", "deepseek_v4", true), ChatFormat::kDeepSeekV41);
  EXPECT_EQ(detect_chat_format("<|im_start|>", "qwen3", false), ChatFormat::kTemplate);
  EXPECT_EQ(parse_chat_format("deepseek-v3.1"), ChatFormat::kDeepSeekV31);
  EXPECT_FALSE(parse_chat_format("nope"));
}

TEST(Conversation, TextOnlyFormatsRejectImages) {
  Conversation c;
  Message m;
  m.content.push_back({ContentPart::Kind::kImage, "", "http://x/y.png"});
  c.messages = {m};
  EXPECT_THROW(encode_deepseek_v3(c, false), Error);
}

}  // namespace
}  // namespace beluga::recipe
