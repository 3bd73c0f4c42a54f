// DeepSeek-V4 and V4.1 prompts, following the reference encoders (encoding_dsv4 / deepseek_v41):
// tools and JSON mode in the first system message, tool results merged into user turns as
// <tool_result> blocks sorted into call order, DSML tool calls, the reasoning-effort preamble, and
// reasoning of turns before the last user turn dropped unless the conversation has tools.
#include <algorithm>
#include <map>
#include <string>

#include "recipe/deepseek_encoders.h"
#include "recipe/deepseek_tokens.h"
#include "recipe/json_depth.h"
#include "recipe/py_json.h"

namespace beluga::recipe {

namespace {

struct Block {
  bool tool_result = false;
  std::string text;
  std::string call_id;
};

// A message after the reference encoder's normalization.
struct V4Msg {
  Role role = Role::kUser;  // kSystem, kUser or kAssistant (tool results live in user blocks)
  std::string content;
  std::vector<Block> blocks;  // user
  const Message* assistant = nullptr;
};

struct Dialect {
  bool v41;
  const char* calls_block;  // "tool_calls" | " calls"
  const char* invoke;       // "invoke" | " invoke"
  const char* parameter;    // "parameter" | " parameter"
};

// Template text: `｜DSML｜` inside it is a control token; everything else is plain text.
void markup(Prompt& p, std::string_view s) {
  const std::string_view dsml = ds::kDsml;
  size_t pos;
  while ((pos = s.find(dsml)) != std::string_view::npos) {
    p.text(s.substr(0, pos));
    p.optional_control(dsml);
    s.remove_prefix(pos + dsml.size());
  }
  p.text(s);
}

std::string tools_prompt_head(const Dialect& d) {
  const std::string D = ds::kDsml;
  std::string blk = d.calls_block, inv = d.invoke, par = d.parameter;
  return "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke "
         "tools by writing a \"<" +
         D + blk + ">\" block like the following:\n\n<" + D + blk + ">\n<" + D + inv +
         " name=\"$TOOL_NAME\">\n<" + D + par +
         " name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</" + D + par + ">\n...\n</" + D +
         inv + ">\n<" + D + inv + " name=\"$TOOL_NAME2\">\n...\n</" + D + inv + ">\n</" + D + blk +
         ">\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types "
         "(numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`."
         "\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning "
         "inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output "
         "directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n";
}

const char* kToolsTail =
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n";

void render_tools(Prompt& p, const Conversation& conv, const Dialect& d) {
  markup(p, tools_prompt_head(d));
  for (size_t i = 0; i < conv.tools.size(); ++i) {
    const Tool& t = conv.tools[i];
    nlohmann::ordered_json fn = nlohmann::ordered_json::object();
    fn["name"] = t.name;
    if (!t.description.empty()) fn["description"] = t.description;
    fn["parameters"] = t.parameters;
    if (i) p.text("\n");
    p.text(py_json_dumps(fn));
  }
  p.text(kToolsTail);
}

std::string effort_prompt(const Conversation& conv, const Dialect& d) {
  if (d.v41) {
    int budget = 50;  // the reference default, "high"
    if (conv.effort) budget = *conv.effort == Effort::kLow ? 25 : *conv.effort == Effort::kHigh ? 50 : 100;
    return "Reasoning Effort: " + std::to_string(budget) +
           " (range 1-100, the higher the value, the more thorough the reasoning)\n\n";
  }
  Effort e = conv.effort.value_or(Effort::kLow);  // the V4 reference default: no preamble
  switch (e) {
    case Effort::kLow:
      return "";
    case Effort::kHigh:
      return "Reasoning Effort: Absolute maximum with no shortcuts permitted.\n"
             "You MUST be very thorough in your thinking and comprehensively decompose the problem to "
             "resolve "
             "the root cause, rigorously stress-testing your logic against all potential paths, edge cases, "
             "and adversarial scenarios.\n"
             "Explicitly write out your entire deliberation process, documenting every intermediate step, "
             "considered alternative, and rejected hypothesis to ensure absolutely no assumption is left "
             "unchecked.\n\n";
    case Effort::kMax:
      return "Reasoning Effort: Beyond maximum — exhaustive, relentless, and uncompromising.\n"
             "You MUST reason with the utmost depth and rigor, leaving absolutely nothing to chance: "
             "exhaustively decompose the problem into its most fundamental components, trace every causal "
             "chain to its root, and resolve the underlying cause rather than any surface symptom.\n"
             "Do not stop reasoning until you have independently verified the solution from multiple angles "
             "and are certain that no assumption remains unchecked and no error remains undiscovered.\n\n";
  }
  return "";
}

// Arguments as DSML parameters; arguments that are not a JSON object become {"arguments": raw}.
void render_arguments(Prompt& p, const ToolCall& c, const Dialect& d) {
  nlohmann::ordered_json args;
  if (c.arguments.empty()) {
    args = nlohmann::ordered_json::object();
  } else {
    // Bounded (json_depth.h): the values are dumped below; deeper arguments stay raw text.
    args = parse_json_bounded(c.arguments);
    if (args.is_string()) {  // double-encoded, tolerated by the reference
      args = parse_json_bounded(args.get<std::string>());
    }
  }
  if (!args.is_object()) args = nlohmann::ordered_json{{"arguments", c.arguments}};
  bool first = true;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (!first) p.text("\n");
    first = false;
    bool is_str = it.value().is_string();
    p.text("<");
    p.optional_control(ds::kDsml);
    p.text(std::string(d.parameter) + " name=\"" + it.key() + "\" string=\"" + (is_str ? "true" : "false") +
           "\">" + (is_str ? it.value().get<std::string>() : py_json_dumps(it.value())) + "</");
    p.optional_control(ds::kDsml);
    p.text(std::string(d.parameter) + ">");
  }
}

void render_tool_calls(Prompt& p, const std::vector<ToolCall>& calls, const Dialect& d) {
  p.text("\n\n<");
  p.optional_control(ds::kDsml);
  p.text(std::string(d.calls_block) + ">\n");
  for (size_t i = 0; i < calls.size(); ++i) {
    if (i) p.text("\n");
    p.text("<");
    p.optional_control(ds::kDsml);
    p.text(std::string(d.invoke) + " name=\"" + calls[i].name + "\">\n");
    render_arguments(p, calls[i], d);
    p.text("\n</");
    p.optional_control(ds::kDsml);
    p.text(std::string(d.invoke) + ">");
  }
  p.text("\n</");
  p.optional_control(ds::kDsml);
  p.text(std::string(d.calls_block) + ">");
}

std::vector<V4Msg> normalize(const Conversation& conv, const Dialect& d) {
  std::vector<V4Msg> out;
  size_t i = 0;
  // Leading system messages merge into one; tools and JSON mode join it (a blank one if absent).
  bool extras = conv.tools_enabled() || conv.json_mode;
  if (i < conv.messages.size() && conv.messages[i].role == Role::kSystem) {
    V4Msg sys{Role::kSystem, conv.messages[i].text(), {}, nullptr};
    for (++i; i < conv.messages.size() && conv.messages[i].role == Role::kSystem; ++i)
      sys.content += "\n\n" + conv.messages[i].text();
    out.push_back(std::move(sys));
  } else if (extras) {
    out.push_back(V4Msg{Role::kSystem, "", {}, nullptr});
  }
  for (; i < conv.messages.size(); ++i) {
    const Message& m = conv.messages[i];
    if (m.role == Role::kSystem && d.v41) {
      out.push_back(V4Msg{Role::kSystem, m.text(), {}, nullptr});
    } else if (m.role == Role::kAssistant) {
      out.push_back(V4Msg{Role::kAssistant, m.text(), {}, &m});
    } else {
      // user, tool, and (V4) later system messages: user turns; consecutive ones merge into one.
      Block b{m.role == Role::kTool, m.text(), m.tool_call_id};
      if (!out.empty() && out.back().role == Role::kUser && !out.back().blocks.empty()) {
        out.back().blocks.push_back(std::move(b));
      } else {
        out.push_back(V4Msg{Role::kUser, "", {std::move(b)}, nullptr});
      }
    }
  }
  // Tool results follow the order of the preceding assistant's calls.
  std::map<std::string, int> order;
  for (auto& m : out) {
    if (m.role == Role::kAssistant && !m.assistant->tool_calls.empty()) {
      order.clear();
      for (size_t k = 0; k < m.assistant->tool_calls.size(); ++k)
        if (!m.assistant->tool_calls[k].id.empty())
          order[m.assistant->tool_calls[k].id] = static_cast<int>(k);
    } else if (m.role == Role::kUser && !order.empty()) {
      std::vector<Block> results;
      for (auto& b : m.blocks)
        if (b.tool_result) results.push_back(b);
      if (results.size() < 2) continue;
      auto rank = [&](const Block& b) {
        auto it = order.find(b.call_id);
        return it == order.end() ? 0 : it->second;
      };
      std::stable_sort(results.begin(), results.end(),
                       [&](const Block& a, const Block& b) { return rank(a) < rank(b); });
      size_t r = 0;
      for (auto& b : m.blocks)
        if (b.tool_result) b = results[r++];
    }
  }
  return out;
}

}  // namespace

Prompt encode_deepseek_v4(const Conversation& conv, bool v41) {
  const Dialect d = v41 ? Dialect{true, " calls", " invoke", " parameter"}
                        : Dialect{false, "tool_calls", "invoke", "parameter"};
  std::vector<V4Msg> msgs = normalize(conv, d);
  const bool thinking = conv.thinking;
  // The reference keeps all reasoning once tools are involved.
  const bool drop = !conv.tools_enabled();
  const bool continue_final =
      !conv.messages.empty() && conv.messages.back().role == Role::kAssistant && conv.messages.back().prefix;
  const bool add_generation_prompt = !continue_final;

  int last_user = -1;
  for (int i = static_cast<int>(msgs.size()) - 1; i >= 0; --i) {
    if (msgs[i].role == Role::kUser || (d.v41 && msgs[i].role == Role::kSystem && i > 0)) {
      last_user = i;
      break;
    }
  }

  Prompt p;
  p.control(ds::kBos);
  for (int i = 0; i < static_cast<int>(msgs.size()); ++i) {
    const V4Msg& m = msgs[i];
    const bool is_last = i + 1 == static_cast<int>(msgs.size());
    std::string effort = (i == 0 && thinking) ? effort_prompt(conv, d) : "";
    if (d.v41 && i == 0 && (!effort.empty() || m.role == Role::kSystem)) p.control(ds::kSystem);
    p.text(effort);

    if (m.role == Role::kSystem) {
      if (d.v41 && i > 0) p.control(ds::kSystem);
      p.text(m.content);
      if (i == 0 && conv.tools_enabled()) {
        p.text("\n\n");
        render_tools(p, conv, d);
      }
      if (i == 0 && conv.json_mode) {
        p.text(
            "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
            "{\"type\": \"json_object\"}");
      }
    } else if (m.role == Role::kUser) {
      p.control(ds::kUser);
      for (size_t k = 0; k < m.blocks.size(); ++k) {
        if (k) p.text("\n\n");
        if (m.blocks[k].tool_result) {
          p.text("<tool_result>" + m.blocks[k].text + "</tool_result>");
        } else {
          p.text(m.blocks[k].text);
        }
      }
    } else {
      const Message& a = *m.assistant;
      const bool wo_eos = is_last && continue_final;
      if (thinking) {
        if (!drop || i > last_user) {
          if (wo_eos && !a.reasoning.empty() && m.content.empty() && a.tool_calls.empty()) {
            p.text(a.reasoning);  // continuing mid-reasoning
          } else {
            p.text(a.reasoning);
            p.control(ds::kThinkEnd);
          }
        }
      }
      p.text(m.content);
      if (!a.tool_calls.empty()) render_tool_calls(p, a.tool_calls, d);
      if (!wo_eos) p.control(ds::kEos);
    }

    // Transition: open the assistant turn after the turn that hands over to it.
    if (d.v41 && is_last && !add_generation_prompt) break;
    if (!is_last && msgs[i + 1].role != Role::kAssistant) continue;
    bool header;
    if (d.v41) {
      header = m.role == Role::kUser || (m.role == Role::kSystem && i > 0) ||
               (is_last && (m.role == Role::kSystem || m.role == Role::kAssistant));
    } else {
      header = m.role == Role::kUser ||
               (m.role == Role::kSystem && (is_last || msgs[i + 1].role == Role::kAssistant));
    }
    if (!header) continue;
    p.control(ds::kAssistant);
    const bool open_thinking = thinking && (!drop || i >= last_user);
    p.control(open_thinking ? ds::kThinkBegin : ds::kThinkEnd);
    if (is_last && conv.tools_enabled() && conv.tool_choice.mode == ToolChoice::Mode::kRequired) {
      // tool_choice=required: prefill the tool-call block opener (the parser starts inside it).
      p.text("\n\n<");
      p.optional_control(ds::kDsml);
      p.text(std::string(d.calls_block) + ">\n");
    }
  }
  return p;
}

}  // namespace beluga::recipe
