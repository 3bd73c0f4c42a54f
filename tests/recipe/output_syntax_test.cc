// Which markup the parser expects of a chat-template model, read from real templates:
// tests/recipe/data/qwen3.jinja is Qwen3's chat_template (from its tokenizer_config.json), and
// llama3.3.jinja is Llama 3.3 Instruct's (as in Meta's tokenizer_config.json: JSON calls with
// "parameters", `<|python_tag|>` for built-in tools).
#include <gtest/gtest.h>

#include <cstdlib>

#include "parser_test_support.h"
#include "recipe/chat_format.h"
#include "recipe/chat_template.h"
#include "recipe/output_parser.h"
#include "recipe/output_syntax.h"

namespace beluga::recipe {
namespace {

using test::K;
using test::source_path;

std::string data(const std::string& name) {
  return read_file(source_path("tests/recipe/data/" + name));
}

ChatTemplateTokens qwen_tokens() {
  return {
      "", "<|im_end|>", {"<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"}};
}

ChatTemplateTokens llama_tokens() {
  return {"<|begin_of_text|>",
          "<|eot_id|>",
          {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
           "<|python_tag|>"}};
}

ChatEncoder encoder(const std::string& source, ChatTemplateTokens tokens) {
  return ChatEncoder(ChatFormat::kTemplate, std::make_shared<const ChatTemplate>(source, std::move(tokens)));
}

// Qwen3's thinking-only variant (Qwen3-*-Thinking-2507 style): the generation prompt opens `<think>`.
std::string qwen3_thinking_template() {
  std::string t = data("qwen3.jinja");
  const std::string gen = "{{- '<|im_start|>assistant\\n' }}";
  const size_t at = t.rfind(gen);
  EXPECT_NE(at, std::string::npos);
  t.replace(at, gen.size(), "{{- '<|im_start|>assistant\\n<think>\\n' }}");
  return t;
}

Conversation ask(bool tools, bool thinking) {
  Conversation c;
  Message m;
  m.role = Role::kUser;
  m.content.push_back({ContentPart::Kind::kText, "Weather in Paris?", ""});
  c.messages.push_back(m);
  if (tools) c.tools = {Tool{"get_weather", "", nlohmann::ordered_json::parse(R"({"type": "object"})")}};
  c.thinking = thinking;
  return c;
}

TEST(ParserSyntaxFromTemplate, Qwen3IsHermesWithThinkTags) {
  ChatEncoder enc = encoder(data("qwen3.jinja"), qwen_tokens());
  const OutputSyntax& s = enc.output_syntax();
  EXPECT_EQ(s.tools, ToolSyntax::kHermes);
  EXPECT_TRUE(s.think_tags);
  // Qwen3 hybrid: with thinking on the model writes `<think>` itself; off, the prompt closes it.
  EXPECT_FALSE(s.prompt_opens_reasoning[0]);
  EXPECT_FALSE(s.prompt_opens_reasoning[1]);

  ParserOptions o = parser_options(enc, ask(true, true), {"STOP"});
  EXPECT_EQ(o.tools, ToolSyntax::kHermes);
  EXPECT_TRUE(o.think_tags);
  EXPECT_FALSE(o.start_in_reasoning);
  EXPECT_EQ(o.stop, std::vector<std::string>{"STOP"});
  EXPECT_EQ(parser_options(enc, ask(false, true), {}).tools, ToolSyntax::kNone);  // no tools offered
  Conversation none = ask(true, false);
  none.tool_choice.mode = ToolChoice::Mode::kNone;
  EXPECT_EQ(parser_options(enc, none, {}).tools, ToolSyntax::kNone);

  // What a Qwen3 reply with thinking on and tools looks like, parsed with those options.
  test::Result r = test::parse_all_ways(
      o,
      "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", "
      "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  EXPECT_EQ(test::text_of(r, K::kReasoning), "The user wants the weather.");
  ASSERT_EQ(test::calls_of(r).size(), 1u);
  EXPECT_EQ(r.finish, FinishReason::kToolCalls);
}

TEST(ParserSyntaxFromTemplate, ThinkingPromptStartsInReasoning) {
  ChatEncoder enc = encoder(qwen3_thinking_template(), qwen_tokens());
  EXPECT_FALSE(enc.output_syntax().prompt_opens_reasoning[0]);  // thinking off still closes the block
  EXPECT_TRUE(enc.output_syntax().prompt_opens_reasoning[1]);
  ParserOptions o = parser_options(enc, ask(false, true), {});
  EXPECT_TRUE(o.start_in_reasoning);
  EXPECT_FALSE(parser_options(enc, ask(false, false), {}).start_in_reasoning);
  test::Result r = test::parse_all_ways(o, "Simple.\n</think>\n\nIt is sunny.");
  EXPECT_EQ(test::text_of(r, K::kReasoning), "Simple.");
  EXPECT_EQ(test::text_of(r, K::kContent), "It is sunny.");
}

TEST(ParserSyntaxFromTemplate, LlamaTemplatesAreLlama3Json) {
  for (const char* name : {"llama3.3.jinja", "llama31_style.jinja"}) {
    SCOPED_TRACE(name);
    ChatEncoder enc = encoder(data(name), llama_tokens());
    EXPECT_EQ(enc.output_syntax().tools, ToolSyntax::kLlama3Json);
    EXPECT_FALSE(enc.output_syntax().think_tags);
    ParserOptions o = parser_options(enc, ask(true, false), {});
    EXPECT_EQ(o.tools, ToolSyntax::kLlama3Json);
    EXPECT_FALSE(o.think_tags);
    EXPECT_FALSE(o.start_in_reasoning);
    test::Result r = test::parse_all_ways(o, R"({"name": "get_weather", "parameters": {"city": "Paris"}})");
    ASSERT_EQ(test::calls_of(r).size(), 1u);
  }
}

TEST(ParserSyntaxFromTemplate, OtherTemplatesHaveNoMarkup) {
  ChatEncoder enc = encoder(data("features.jinja"), {});
  EXPECT_EQ(enc.output_syntax().tools, ToolSyntax::kNone);
  EXPECT_FALSE(enc.output_syntax().think_tags);
  EXPECT_EQ(parser_options(enc, ask(true, true), {}).tools, ToolSyntax::kNone);
}

TEST(ParserSyntaxFromTemplate, DeepSeekFormatsKeepTheirOwn) {
  Conversation c = ask(true, true);
  for (ChatFormat f : {ChatFormat::kDeepSeekV3, ChatFormat::kDeepSeekR1, ChatFormat::kDeepSeekV31,
                       ChatFormat::kDeepSeekV4}) {
    ParserOptions a = parser_options(ChatEncoder(f), c, {});
    ParserOptions b = parser_options(f, c, {});
    EXPECT_EQ(a.tools, b.tools);
    EXPECT_EQ(a.start_in_reasoning, b.start_in_reasoning);
    EXPECT_FALSE(a.think_tags);
  }
}

TEST(ParserSyntaxFromTemplate, FromAModelDirectory) {
  // The path the server takes: tokenizer_config.json's chat_template, read by from_model_dir.
  char dir[] = "/tmp/beluga-syntax-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  nlohmann::json cfg = {{"chat_template", data("qwen3.jinja")}, {"eos_token", "<|im_end|>"}};
  write_file(std::string(dir) + "/tokenizer_config.json", cfg.dump());
  ChatEncoder enc = ChatEncoder::from_model_dir(dir);
  std::remove((std::string(dir) + "/tokenizer_config.json").c_str());
  std::remove(dir);
  EXPECT_EQ(enc.format(), ChatFormat::kTemplate);
  EXPECT_EQ(enc.output_syntax().tools, ToolSyntax::kHermes);
  EXPECT_TRUE(enc.output_syntax().think_tags);
}

}  // namespace
}  // namespace beluga::recipe
