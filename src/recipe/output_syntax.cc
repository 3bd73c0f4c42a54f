#include "recipe/output_syntax.h"

#include <string_view>

#include "recipe/chat_template.h"

namespace beluga::recipe {

namespace {

bool contains(std::string_view hay, std::string_view needle) {
  return hay.find(needle) != std::string_view::npos;
}

// Whether the rendered prompt leaves the reply inside an open `<think>` block.
bool prompt_opens_reasoning(const ChatTemplate& tmpl, bool thinking) {
  Conversation conv;
  Message m;
  m.role = Role::kUser;
  m.content.push_back({ContentPart::Kind::kText, "Hi", ""});
  conv.messages.push_back(std::move(m));
  conv.thinking = thinking;
  std::string s;
  try {
    s = tmpl.render(conv).str();
  } catch (const std::exception&) {
    return false;  // templates may insist on things a probe lacks (a system message, tools)
  }
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.ends_with("<think>");
}

}  // namespace

OutputSyntax template_output_syntax(const ChatTemplate& tmpl) {
  const std::string_view chat_template = tmpl.source();
  OutputSyntax o;
  // Hermes first: its tags are specific, while Llama header tokens only say which family it is.
  if (contains(chat_template, "<tool_call>"))
    o.tools = ToolSyntax::kHermes;
  else if (contains(chat_template, "<|python_tag|>") || contains(chat_template, "<|start_header_id|>"))
    o.tools = ToolSyntax::kLlama3Json;
  o.think_tags = contains(chat_template, "<think>");
  if (o.think_tags) {
    o.prompt_opens_reasoning[0] = prompt_opens_reasoning(tmpl, false);
    o.prompt_opens_reasoning[1] = prompt_opens_reasoning(tmpl, true);
  }
  return o;
}

}  // namespace beluga::recipe
