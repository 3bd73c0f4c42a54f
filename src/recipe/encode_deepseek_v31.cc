// DeepSeek-V3.1 (hybrid thinking) prompts, following the official V3.1 chat template: system messages
// joined at the top, `<｜Assistant｜></think>` (or `<think>` when thinking) opening the reply to the
// last user turn, history reasoning always dropped, tool calls `name<｜tool▁sep｜>{json}` chained
// without separators, and the reply after tool outputs continuing with no new header.
#include <string>

#include "recipe/deepseek_encoders.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/py_json.h"

namespace beluga::recipe {

namespace {

// The tool section the V3.1 model card prescribes for the system prompt.
void tools_section(Prompt& p, const Conversation& conv) {
  p.text("## Tools\nYou have access to the following tools:\n\n");
  for (const auto& t : conv.tools) {
    p.text("### " + t.name + "\nDescription: " + t.description +
           "\n\nParameters: " + py_json_dumps(t.parameters) + "\n\n");
  }
  p.text("IMPORTANT: ALWAYS adhere to this exact format for tool use:\n");
  p.control(ds::kCallsBegin);
  p.control(ds::kCallBegin);
  p.text("tool_call_name");
  p.control(ds::kToolSep);
  p.text("tool_call_arguments");
  p.control(ds::kCallEnd);
  p.text("{{additional_tool_calls}}");
  p.control(ds::kCallsEnd);
  p.text(
      "\n\nWhere:\n\n- `tool_call_name` must be an exact match to one of the available tools\n"
      "- `tool_call_arguments` must be valid JSON that strictly follows the tool's Parameters Schema\n"
      "- For multiple tool calls, chain them directly without separators or spaces\n");
}

}  // namespace

Prompt encode_deepseek_v31(const Conversation& conv) {
  Prompt p;
  p.control(ds::kBos);
  bool first_system = true;
  for (const auto& m : conv.messages) {
    if (m.role != Role::kSystem) continue;
    if (!first_system) p.text("\n\n");
    p.text(m.text());
    first_system = false;
  }
  if (conv.tools_enabled()) {
    if (!first_system) p.text("\n\n");
    tools_section(p, conv);
  }

  bool last_user = false;  // the previous turn was the user's: the assistant header is due
  bool is_tool = false;
  bool prefix_open = false;
  for (size_t i = 0; i < conv.messages.size(); ++i) {
    const Message& m = conv.messages[i];
    switch (m.role) {
      case Role::kSystem:
        break;
      case Role::kUser:
        is_tool = false;
        last_user = true;
        p.control(ds::kUser);
        p.text(m.text());
        break;
      case Role::kAssistant: {
        bool prefix = m.prefix && i + 1 == conv.messages.size();
        std::string content = m.text();
        if (last_user) {
          p.control(ds::kAssistant);
          // A continued message in thinking mode resumes inside the reasoning.
          p.control(prefix && conv.thinking && m.tool_calls.empty() ? ds::kThinkBegin : ds::kThinkEnd);
        }
        last_user = false;
        if (prefix && conv.thinking && m.tool_calls.empty() && !m.reasoning.empty()) {
          p.text(m.reasoning);
          if (!content.empty()) {
            p.control(ds::kThinkEnd);
            p.text(content);
          }
          prefix_open = true;
          break;
        }
        if (!is_tool) {
          auto pos = content.find(ds::kThinkEnd);
          if (pos != std::string::npos) content = content.substr(pos + std::string(ds::kThinkEnd).size());
        }
        is_tool = false;
        p.text(content);
        for (size_t k = 0; k < m.tool_calls.size(); ++k) {
          if (k == 0) p.control(ds::kCallsBegin);
          p.control(ds::kCallBegin);
          p.text(m.tool_calls[k].name);
          p.control(ds::kToolSep);
          p.text(m.tool_calls[k].arguments);
          p.control(ds::kCallEnd);
        }
        if (!m.tool_calls.empty()) p.control(ds::kCallsEnd);
        if (prefix) {
          prefix_open = true;
        } else {
          p.control(ds::kEos);
        }
        break;
      }
      case Role::kTool:
        last_user = false;
        is_tool = true;
        p.control(ds::kOutputBegin);
        p.text(m.text());
        p.control(ds::kOutputEnd);
        break;
    }
  }
  if (last_user && !is_tool && !prefix_open) {
    p.control(ds::kAssistant);
    p.control(conv.thinking ? ds::kThinkBegin : ds::kThinkEnd);
  }
  return p;
}

}  // namespace beluga::recipe
