// Anthropic Messages request -> ParsedRequest: `system`, content blocks (text, image, tool_use,
// tool_result, thinking), tools with `input_schema` (server tools are rejected, as the DeepSeek
// Anthropic endpoint does), `tool_choice` auto/any/tool/none, `thinking`, `output_config.effort`.
#include "recipe/json_depth.h"
#include "recipe/json_fields.h"
#include "recipe/py_json.h"
#include "recipe/request.h"

namespace beluga::recipe {

using Json = nlohmann::ordered_json;

namespace {

std::string text_blocks(const Fields& f, const Json& c, const std::string& path) {
  if (c.is_string()) return c.get<std::string>();
  f.array(c, path);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string p = path_index(path, i);
    const Json& b = f.object(c[i], p);
    std::string type = f.string(f.required(b, "type", p), path_join(p, "type"));
    if (type != "text") f.fail(path_join(p, "type"), "expected a text block, got '" + type + "'");
    if (i) out += "\n\n";
    out += f.string(f.required(b, "text", p), path_join(p, "text"));
  }
  return out;
}

}  // namespace

ParsedRequest parse_messages_request(const Json& body, const ParseOptions& opt) {
  const Fields f(Api::kMessages);
  if (!body.is_object()) f.fail("", "the request body must be a JSON object");
  check_request_depth(Api::kMessages, body);  // before anything walks it recursively
  ParsedRequest r;
  r.api = Api::kMessages;
  Conversation& conv = r.conversation;
  conv.thinking = opt.default_thinking;
  r.model = f.string(f.required(body, "model", ""), "model");
  r.max_tokens = f.integer(f.required(body, "max_tokens", ""), "max_tokens", 1, INT64_MAX);
  if (Fields::has(body, "system")) {
    conv.messages.push_back(
        Message{Role::kSystem,
                {{ContentPart::Kind::kText, text_blocks(f, body["system"], "system"), ""}},
                {},
                {},
                {},
                {},
                false});
  }
  const Json& msgs = f.array(f.required(body, "messages", ""), "messages");
  if (msgs.empty()) f.fail("messages", "at least one message is required");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const std::string path = path_index("messages", i);
    const Json& m = f.object(msgs[i], path);
    std::string role = f.string(f.required(m, "role", path), path_join(path, "role"));
    if (role != "user" && role != "assistant")
      f.fail(path_join(path, "role"), "must be 'user' or 'assistant', got '" + role + "'");
    const bool user = role == "user";
    const Json& c = f.required(m, "content", path);
    const std::string cpath = path_join(path, "content");
    Message msg;
    msg.role = user ? Role::kUser : Role::kAssistant;
    if (c.is_string()) {
      msg.content.push_back({ContentPart::Kind::kText, c.get<std::string>(), ""});
      conv.messages.push_back(std::move(msg));
      continue;
    }
    f.array(c, cpath);
    std::vector<Message> tool_results;  // user turns: results go before the user's own text
    for (size_t k = 0; k < c.size(); ++k) {
      const std::string p = path_index(cpath, k);
      const Json& b = f.object(c[k], p);
      std::string type = f.string(f.required(b, "type", p), path_join(p, "type"));
      if (type == "text") {
        msg.content.push_back(
            {ContentPart::Kind::kText, f.string(f.required(b, "text", p), path_join(p, "text")), ""});
      } else if (type == "image" && user) {
        const Json& src = f.object(f.required(b, "source", p), path_join(p, "source"));
        std::string st =
            f.string(f.required(src, "type", path_join(p, "source")), path_join(p, "source.type"));
        std::string url;
        if (st == "base64") {
          url = "data:" +
                f.string(f.required(src, "media_type", path_join(p, "source")),
                         path_join(p, "source.media_type")) +
                ";base64," +
                f.string(f.required(src, "data", path_join(p, "source")), path_join(p, "source.data"));
        } else if (st == "url") {
          url = f.string(f.required(src, "url", path_join(p, "source")), path_join(p, "source.url"));
        } else {
          f.fail(path_join(p, "source.type"), "unsupported image source '" + st + "'");
        }
        msg.content.push_back({ContentPart::Kind::kImage, "", url});
      } else if (type == "tool_use" && !user) {
        ToolCall tc;
        tc.id = f.string(f.required(b, "id", p), path_join(p, "id"));
        tc.name = f.string(f.required(b, "name", p), path_join(p, "name"));
        tc.arguments = py_json_dumps(f.object(f.required(b, "input", p), path_join(p, "input")));
        msg.tool_calls.push_back(std::move(tc));
      } else if (type == "tool_result" && user) {
        Message t;
        t.role = Role::kTool;
        t.tool_call_id = f.string(f.required(b, "tool_use_id", p), path_join(p, "tool_use_id"));
        std::string text =
            Fields::has(b, "content") ? text_blocks(f, b["content"], path_join(p, "content")) : "";
        t.content.push_back({ContentPart::Kind::kText, text, ""});
        tool_results.push_back(std::move(t));
      } else if (type == "thinking" && !user) {
        msg.reasoning += f.string(f.required(b, "thinking", p), path_join(p, "thinking"));
      } else if (type == "redacted_thinking" && !user) {
        continue;  // opaque to us
      } else {
        f.fail(path_join(p, "type"),
               "content block type '" + type + "' is not allowed in a " + role + " message");
      }
    }
    for (auto& t : tool_results) conv.messages.push_back(std::move(t));
    if (!user || !msg.content.empty() || tool_results.empty()) conv.messages.push_back(std::move(msg));
  }
  if (Fields::has(body, "tools")) {
    const Json& tools = f.array(body["tools"], "tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string p = path_index("tools", i);
      const Json& t = f.object(tools[i], p);
      if (Fields::has(t, "type")) {
        std::string type = f.string(t["type"], path_join(p, "type"));
        if (type != "custom") f.fail(path_join(p, "type"), "server tools are not supported ('" + type + "')");
      }
      Tool tool;
      tool.name = f.string(f.required(t, "name", p), path_join(p, "name"));
      if (Fields::has(t, "description"))
        tool.description = f.string(t["description"], path_join(p, "description"));
      tool.parameters = f.schema(f.required(t, "input_schema", p), path_join(p, "input_schema"));
      conv.tools.push_back(std::move(tool));
    }
  }
  if (Fields::has(body, "tool_choice")) {
    const Json& tc = f.object(body["tool_choice"], "tool_choice");
    std::string type = f.string(f.required(tc, "type", "tool_choice"), "tool_choice.type");
    if (type == "auto")
      conv.tool_choice.mode = ToolChoice::Mode::kAuto;
    else if (type == "any")
      conv.tool_choice.mode = ToolChoice::Mode::kRequired;
    else if (type == "none")
      conv.tool_choice.mode = ToolChoice::Mode::kNone;
    else if (type == "tool") {
      conv.tool_choice.mode = ToolChoice::Mode::kFunction;
      conv.tool_choice.function = f.string(f.required(tc, "name", "tool_choice"), "tool_choice.name");
      bool found = false;
      for (const auto& t : conv.tools) found = found || t.name == conv.tool_choice.function;
      if (!found) f.fail("tool_choice.name", "tool '" + conv.tool_choice.function + "' is not in 'tools'");
    } else {
      f.fail("tool_choice.type", "must be 'auto', 'any', 'tool' or 'none'");
    }
  }
  if (Fields::has(body, "thinking")) {
    const Json& th = f.object(body["thinking"], "thinking");
    std::string type = f.string(f.required(th, "type", "thinking"), "thinking.type");
    if (type != "enabled" && type != "disabled" && type != "adaptive")
      f.fail("thinking.type", "must be 'enabled' or 'disabled'");
    conv.thinking = type != "disabled";
    if (type == "enabled" && Fields::has(th, "budget_tokens"))
      f.integer(th["budget_tokens"], "thinking.budget_tokens", 1024, *r.max_tokens);
  }
  if (Fields::has(body, "output_config")) {
    const Json& oc = f.object(body["output_config"], "output_config");
    if (Fields::has(oc, "effort")) conv.effort = f.effort(oc["effort"], "output_config.effort");
    if (Fields::has(oc, "format"))
      r.constraint = anthropic_output_format(f, oc["format"], "output_config.format");
  }
  if (Fields::has(body, "output_format"))  // the structured-outputs beta's spelling
    merge_constraint(f, r.constraint, anthropic_output_format(f, body["output_format"], "output_format"));
  conv.json_mode = r.constraint.active();
  if (Fields::has(body, "stop_sequences"))
    r.stop = f.stop(f.array(body["stop_sequences"], "stop_sequences"), "stop_sequences", 64);
  if (Fields::has(body, "temperature"))
    r.sampling.temperature = f.number(body["temperature"], "temperature", 0, 1);
  if (Fields::has(body, "top_p")) r.sampling.top_p = f.number(body["top_p"], "top_p", 0, 1);
  if (Fields::has(body, "top_k"))
    r.sampling.top_k = static_cast<int>(f.integer(body["top_k"], "top_k", 0, 1 << 30));
  if (Fields::has(body, "stream")) r.stream = f.boolean(body["stream"], "stream");
  return r;
}

}  // namespace beluga::recipe
