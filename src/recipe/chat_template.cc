#include "recipe/chat_template.h"

#include <algorithm>
#include <array>

#include "recipe/json_depth.h"
#include "util/error.h"

namespace beluga::recipe {

namespace {

using jinja::Value;

// Request JSON (tool schemas) as Jinja values; every string and key is request data.
// Recursive: request JSON is bounded when parsed (json_depth.h), and the check keeps it so.
Value from_json(const nlohmann::ordered_json& j, int depth = 0) {
  if (j.is_structured() && ++depth > kMaxJsonDepth)
    fail("JSON nested deeper than ", kMaxJsonDepth, " levels cannot be passed to a chat template");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::new_dict();
      d.dict->data_keys = true;
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), from_json(it.value(), depth));
      return d;
    }
    case nlohmann::ordered_json::value_t::array: {
      jinja::List items;
      for (const auto& x : j) items.push_back(from_json(x, depth));
      return Value::new_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::string:
      return Value::string(j.get<std::string>(), true);
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    default:
      return Value::none();
  }
}

Value message_value(const Message& m) {
  Value d = Value::new_dict();
  d.dict->set("role", Value::string(role_name(m.role)));
  // OpenAI semantics: an assistant turn that only calls tools has content null.
  std::string text = m.text();
  if (m.role == Role::kAssistant && text.empty() && !m.tool_calls.empty()) {
    d.dict->set("content", Value::none());
  } else {
    d.dict->set("content", Value::string(text, true));
  }
  if (!m.reasoning.empty()) d.dict->set("reasoning_content", Value::string(m.reasoning, true));
  if (!m.tool_calls.empty()) {
    jinja::List calls;
    for (const auto& c : m.tool_calls) {
      Value fn = Value::new_dict();
      fn.dict->set("name", Value::string(c.name, true));
      fn.dict->set("arguments", Value::string(c.arguments, true));
      Value call = Value::new_dict();
      call.dict->set("id", Value::string(c.id, true));
      call.dict->set("type", Value::string("function"));
      call.dict->set("function", fn);
      calls.push_back(call);
    }
    d.dict->set("tool_calls", Value::new_list(std::move(calls)));
  }
  if (m.role == Role::kTool) {
    d.dict->set("tool_call_id", Value::string(m.tool_call_id, true));
    if (!m.name.empty()) d.dict->set("name", Value::string(m.name, true));
  }
  if (m.prefix) d.dict->set("prefix", Value::boolean(true));
  return d;
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source, ChatTemplateTokens tokens)
    : source_(source), template_(source), tokens_(std::move(tokens)) {
  // Longest spelling first, so `<｜tool▁calls▁begin｜>` wins over any shorter token it contains.
  std::sort(tokens_.added.begin(), tokens_.added.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  std::erase_if(tokens_.added, [](const std::string& s) { return s.empty(); });
}

jinja::Dict ChatTemplate::context(const Conversation& conv) const {
  jinja::Dict ctx;
  jinja::List messages;
  for (const auto& m : conv.messages) messages.push_back(message_value(m));
  ctx.set("messages", Value::new_list(std::move(messages)));
  if (conv.tools_enabled()) {
    jinja::List tools;
    for (const auto& t : conv.tools) {
      nlohmann::ordered_json fn = {{"name", t.name}};
      if (!t.description.empty()) fn["description"] = t.description;
      fn["parameters"] = t.parameters;
      tools.push_back(from_json(nlohmann::ordered_json{{"type", "function"}, {"function", fn}}));
    }
    ctx.set("tools", Value::new_list(std::move(tools)));
  }
  const bool continue_final = !conv.messages.empty() && conv.messages.back().prefix;
  ctx.set("add_generation_prompt", Value::boolean(!continue_final));
  ctx.set("bos_token", Value::string(tokens_.bos));
  ctx.set("eos_token", Value::string(tokens_.eos));
  // Both spellings templates use for the thinking switch (Qwen3: enable_thinking; DeepSeek: thinking).
  ctx.set("enable_thinking", Value::boolean(conv.thinking));
  ctx.set("thinking", Value::boolean(conv.thinking));
  return ctx;
}

Prompt ChatTemplate::render(const Conversation& conv) const {
  for (const auto& m : conv.messages) (void)m.text();  // rejects images with a clear message
  Value out = template_.render(context(conv));
  Prompt p;
  // Only positions holding a byte some added token starts with are compared against the tokens:
  // comparing every byte with every token was O(bytes x tokens), and a template may print tens of
  // MiB of its own text (fuzz_jinja: `{{ 'x' * 20000000 }}` took 14 s under ASan).
  std::array<bool, 256> starts{};
  for (const auto& t : tokens_.added) starts[static_cast<unsigned char>(t[0])] = true;  // none is empty
  auto literal = [&](std::string_view s) {
    size_t i = 0, text_start = 0;
    while (i < s.size()) {
      if (!starts[static_cast<unsigned char>(s[i])]) {
        ++i;
        continue;
      }
      const std::string* hit = nullptr;
      for (const auto& t : tokens_.added) {
        if (s.compare(i, t.size(), t) == 0) {
          hit = &t;
          break;
        }
      }
      if (hit) {
        p.text(s.substr(text_start, i - text_start));
        p.control(*hit);
        i += hit->size();
        text_start = i;
      } else {
        ++i;
      }
    }
    p.text(s.substr(text_start));
  };
  size_t pos = 0;
  const std::string_view s = out.s;
  for (const auto& r : out.data) {
    literal(s.substr(pos, r.begin - pos));
    p.text(s.substr(r.begin, r.end - r.begin));
    pos = r.end;
  }
  literal(s.substr(pos));
  return p;
}

}  // namespace beluga::recipe
