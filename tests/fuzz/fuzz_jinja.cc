// libFuzzer target: the Jinja parser and interpreter on hostile templates. The input is a chat
// template; it is parsed, then rendered (as ChatTemplate does for a request) over a conversation with
// a system prompt, tools, an assistant tool call and a tool result. Contract: a template is rendered
// or refused with beluga::Error (parse errors, raise_exception, limits); anything else is a finding.
#include "fuzz_support.h"
#include "recipe/chat_template.h"
#include "util/error.h"

namespace {

beluga::recipe::Conversation sample_conversation() {
  using namespace beluga::recipe;
  Conversation c;
  auto msg = [](Role r, std::string text) {
    Message m;
    m.role = r;
    m.content.push_back({ContentPart::Kind::kText, std::move(text), ""});
    return m;
  };
  c.messages.push_back(msg(Role::kSystem, "You are terse."));
  c.messages.push_back(msg(Role::kUser, "Weather in <|im_start|> Paris?"));
  Message a;
  a.role = Role::kAssistant;
  a.reasoning = "Need the tool.";
  a.tool_calls.push_back({"call_1", "get_weather", R"({"city": "Paris", "days": [1, 2]})"});
  c.messages.push_back(a);
  Message t = msg(Role::kTool, "{\"temp\": 21}");
  t.tool_call_id = "call_1";
  c.messages.push_back(t);
  c.messages.push_back(msg(Role::kUser, "Thanks"));
  Tool tool;
  tool.name = "get_weather";
  tool.description = "Current weather";
  tool.parameters = nlohmann::ordered_json::parse(
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})");
  c.tools.push_back(tool);
  c.thinking = true;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const beluga::recipe::Conversation conv = sample_conversation();
  const std::string source(beluga::fuzz::as_text(data, size));
  beluga::fuzz::expect_only<beluga::Error>([&] {
    beluga::recipe::ChatTemplate t(source,
                                   {"<|bos|>", "<|eos|>", {"<|im_start|>", "<|im_end|>", "<tool_call>"}});
    beluga::recipe::Prompt p = t.render(conv);
    (void)p.str();
  });
  return 0;
}
