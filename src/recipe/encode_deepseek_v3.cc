// DeepSeek-V3 and R1 prompts, following the official chat templates (tokenizer_config.json of
// DeepSeek-V3 / DeepSeek-R1). Where the official template misrenders (its `is_first` and
// `is_output_first` flags are never reset, so a second tool round loses its opener), this encoder
// renders the intended layout; on every conversation the template handles correctly it matches it
// byte for byte (tests/recipe compares both).
#include <string>

#include "recipe/deepseek_encoders.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/py_json.h"

namespace beluga::recipe {

namespace {

// The official V3 template has no tool section; requests with tools still need the model to learn
// them, so they are described in the system prompt in the format the model emits.
void tools_section(Prompt& p, const Conversation& conv) {
  p.text("## Tools\nYou have access to the following tools:\n\n");
  for (const auto& t : conv.tools) {
    p.text("### " + t.name + "\nDescription: " + t.description +
           "\n\nParameters: " + py_json_dumps(t.parameters) + "\n\n");
  }
  p.text("IMPORTANT: ALWAYS adhere to this exact format for tool use:\n");
  p.control(ds::kCallsBegin);
  p.control(ds::kCallBegin);
  p.text("function");
  p.control(ds::kToolSep);
  p.text("tool_call_name\n```json\ntool_call_arguments\n```");
  p.control(ds::kCallEnd);
  p.control(ds::kCallsEnd);
  p.text("\n\nWhere `tool_call_arguments` is valid JSON that follows the tool's Parameters schema.");
}

// R1 history keeps only the answer: the text after the last `</think>`.
std::string strip_reasoning(const std::string& content) {
  auto pos = content.rfind(ds::kThinkEnd);
  return pos == std::string::npos ? content : content.substr(pos + std::string(ds::kThinkEnd).size());
}

}  // namespace

Prompt encode_deepseek_v3(const Conversation& conv, bool r1) {
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

  bool in_tool_outputs = false;  // inside <｜tool▁outputs▁begin｜> … awaiting its end
  auto close_outputs = [&] {
    if (in_tool_outputs) p.control(ds::kOutputsEnd);
    in_tool_outputs = false;
  };
  bool prefix_open = false;
  for (size_t i = 0; i < conv.messages.size(); ++i) {
    const Message& m = conv.messages[i];
    switch (m.role) {
      case Role::kSystem:
        break;
      case Role::kUser:
        close_outputs();
        p.control(ds::kUser);
        p.text(m.text());
        break;
      case Role::kAssistant: {
        // After tool outputs the assistant continues without a new <｜Assistant｜> (official layout).
        bool after_tools = in_tool_outputs;
        close_outputs();
        if (!after_tools) p.control(ds::kAssistant);
        std::string content = m.text();
        if (r1) content = strip_reasoning(content);
        p.text(content);
        if (!m.tool_calls.empty()) {
          p.control(ds::kCallsBegin);
          for (size_t k = 0; k < m.tool_calls.size(); ++k) {
            const ToolCall& c = m.tool_calls[k];
            if (k) p.text("\n");
            p.control(ds::kCallBegin);
            p.text("function");
            p.control(ds::kToolSep);
            p.text(c.name + "\n```json\n" + c.arguments + "\n```");
            p.control(ds::kCallEnd);
          }
          p.control(ds::kCallsEnd);
        }
        if (m.prefix && i + 1 == conv.messages.size()) {
          prefix_open = true;  // continue this message: no end-of-sentence, no new header
        } else {
          p.control(ds::kEos);
        }
        break;
      }
      case Role::kTool:
        if (!in_tool_outputs) {
          p.control(ds::kOutputsBegin);
        } else {
          p.text("\n");
        }
        in_tool_outputs = true;
        p.control(ds::kOutputBegin);
        p.text(m.text());
        p.control(ds::kOutputEnd);
        break;
    }
  }
  if (in_tool_outputs) {
    close_outputs();
  } else if (!prefix_open) {
    p.control(ds::kAssistant);
    if (r1) {
      p.control(ds::kThinkBegin);
      p.text("\n");
    }
  }
  return p;
}

}  // namespace beluga::recipe
