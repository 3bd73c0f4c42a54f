// OpenAI Chat Completions request -> ParsedRequest (DeepSeek's extensions included: `thinking`,
// `reasoning_content`, assistant `prefix` continuation, `top_k`).
#include "recipe/json_depth.h"
#include "recipe/json_fields.h"
#include "recipe/py_json.h"
#include "recipe/request.h"

namespace beluga::recipe {

using Json = nlohmann::ordered_json;

namespace {

// String content or an array of text / image_url parts.
std::vector<ContentPart> chat_content(const Fields& f, const Json& c, const std::string& path) {
  std::vector<ContentPart> parts;
  if (c.is_string()) {
    parts.push_back({ContentPart::Kind::kText, c.get<std::string>(), ""});
    return parts;
  }
  f.array(c, path);
  for (size_t i = 0; i < c.size(); ++i) {
    const std::string p = path_index(path, i);
    const Json& part = f.object(c[i], p);
    std::string type = f.string(f.required(part, "type", p), path_join(p, "type"));
    if (type == "text") {
      parts.push_back(
          {ContentPart::Kind::kText, f.string(f.required(part, "text", p), path_join(p, "text")), ""});
    } else if (type == "image_url") {
      const Json& iu = f.required(part, "image_url", p);
      std::string url = iu.is_string() ? iu.get<std::string>()
                                       : f.string(f.required(f.object(iu, path_join(p, "image_url")), "url",
                                                             path_join(p, "image_url")),
                                                  path_join(p, "image_url.url"));
      parts.push_back({ContentPart::Kind::kImage, "", url});
    } else {
      f.fail(path_join(p, "type"), "unsupported content part type '" + type + "'");
    }
  }
  return parts;
}

Message chat_message(const Fields& f, const Json& m, const std::string& path, bool last) {
  f.object(m, path);
  std::string role = f.string(f.required(m, "role", path), path_join(path, "role"));
  Message out;
  if (role == "system" || role == "developer") {
    out.role = Role::kSystem;
  } else if (role == "user") {
    out.role = Role::kUser;
  } else if (role == "assistant") {
    out.role = Role::kAssistant;
  } else if (role == "tool") {
    out.role = Role::kTool;
  } else {
    f.fail(path_join(path, "role"), "unknown role '" + role + "'");
  }
  const std::string cpath = path_join(path, "content");
  if (Fields::has(m, "content")) {
    out.content = chat_content(f, m["content"], cpath);
  } else if (out.role != Role::kAssistant) {
    f.fail(cpath, "Field required");
  }
  if (out.role != Role::kUser && out.role != Role::kSystem && out.has_image())
    f.fail(cpath, "images are only allowed in user messages");
  if (out.role == Role::kAssistant) {
    if (Fields::has(m, "reasoning_content"))
      out.reasoning = f.string(m["reasoning_content"], path_join(path, "reasoning_content"));
    if (Fields::has(m, "tool_calls")) {
      const Json& calls = f.array(m["tool_calls"], path_join(path, "tool_calls"));
      for (size_t i = 0; i < calls.size(); ++i) {
        const std::string p = path_index(path_join(path, "tool_calls"), i);
        const Json& c = f.object(calls[i], p);
        if (Fields::has(c, "type") && f.string(c["type"], path_join(p, "type")) != "function")
          f.fail(path_join(p, "type"), "only 'function' tool calls are supported");
        const Json& fn = f.object(f.required(c, "function", p), path_join(p, "function"));
        ToolCall tc;
        tc.id = Fields::has(c, "id") ? f.string(c["id"], path_join(p, "id")) : "";
        tc.name = f.string(f.required(fn, "name", path_join(p, "function")), path_join(p, "function.name"));
        const Json& args = f.required(fn, "arguments", path_join(p, "function"));
        tc.arguments = args.is_string() ? args.get<std::string>() : py_json_dumps(args);
        out.tool_calls.push_back(std::move(tc));
      }
    }
    if (!Fields::has(m, "content") && out.tool_calls.empty()) f.fail(cpath, "Field required");
    if (Fields::has(m, "prefix")) {
      out.prefix = f.boolean(m["prefix"], path_join(path, "prefix"));
      if (out.prefix && !last) f.fail(path_join(path, "prefix"), "only the last message may be a prefix");
    }
  }
  if (out.role == Role::kTool) {
    out.tool_call_id = f.string(f.required(m, "tool_call_id", path), path_join(path, "tool_call_id"));
  }
  if (Fields::has(m, "name") && out.role == Role::kTool)
    out.name = f.string(m["name"], path_join(path, "name"));
  return out;
}

}  // namespace

ParsedRequest parse_chat_request(const Json& body, const ParseOptions& opt) {
  const Fields f(Api::kChat);
  if (!body.is_object()) f.fail("", "the request body must be a JSON object");
  check_request_depth(Api::kChat, body);  // before anything walks it recursively
  ParsedRequest r;
  r.api = Api::kChat;
  Conversation& conv = r.conversation;
  conv.thinking = opt.default_thinking;
  if (Fields::has(body, "model")) r.model = f.string(body["model"], "model");
  const Json& msgs = f.array(f.required(body, "messages", ""), "messages");
  if (msgs.empty()) f.fail("messages", "must contain at least one message");
  for (size_t i = 0; i < msgs.size(); ++i)
    conv.messages.push_back(chat_message(f, msgs[i], path_index("messages", i), i + 1 == msgs.size()));

  if (Fields::has(body, "tools")) {
    const Json& tools = f.array(body["tools"], "tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string p = path_index("tools", i);
      const Json& t = f.object(tools[i], p);
      std::string type = f.string(f.required(t, "type", p), path_join(p, "type"));
      if (type != "function") f.fail(path_join(p, "type"), "unsupported tool type '" + type + "'");
      const Json& fn = f.object(f.required(t, "function", p), path_join(p, "function"));
      Tool tool = f.function_tool(fn, path_join(p, "function"));
      conv.tools.push_back(std::move(tool));
    }
  }
  if (Fields::has(body, "tool_choice")) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      conv.tool_choice.mode = f.tool_choice_mode(tc, "tool_choice");
    } else {
      f.object(tc, "tool_choice");
      const Json& fn = f.object(f.required(tc, "function", "tool_choice"), "tool_choice.function");
      conv.tool_choice.mode = ToolChoice::Mode::kFunction;
      conv.tool_choice.function =
          f.string(f.required(fn, "name", "tool_choice.function"), "tool_choice.function.name");
    }
    if (conv.tool_choice.mode != ToolChoice::Mode::kNone &&
        conv.tool_choice.mode != ToolChoice::Mode::kAuto && conv.tools.empty())
      f.fail("tool_choice", "requires 'tools'");
    if (conv.tool_choice.mode == ToolChoice::Mode::kFunction) f.check_choice_in_tools(conv, "tool_choice");
  }
  if (Fields::has(body, "thinking")) {
    const Json& th = f.object(body["thinking"], "thinking");
    std::string type = f.string(f.required(th, "type", "thinking"), "thinking.type");
    if (type != "enabled" && type != "disabled") f.fail("thinking.type", "must be 'enabled' or 'disabled'");
    conv.thinking = type == "enabled";
  }
  if (Fields::has(body, "reasoning_effort"))
    conv.effort = f.effort(body["reasoning_effort"], "reasoning_effort");
  if (Fields::has(body, "response_format"))
    r.constraint = openai_response_format(f, body["response_format"], "response_format");
  if (Fields::has(body, "structured_outputs"))  // vLLM's field
    merge_constraint(f, r.constraint,
                     vllm_structured_outputs(f, body["structured_outputs"], "structured_outputs"));
  conv.json_mode = r.constraint.kind == OutputConstraint::Kind::kJsonObject ||
                   r.constraint.kind == OutputConstraint::Kind::kJsonSchema;
  if (Fields::has(body, "stop")) r.stop = f.stop(body["stop"], "stop", 16);
  if (Fields::has(body, "max_completion_tokens"))
    r.max_tokens = f.integer(body["max_completion_tokens"], "max_completion_tokens", 1, INT64_MAX);
  else if (Fields::has(body, "max_tokens"))
    r.max_tokens = f.integer(body["max_tokens"], "max_tokens", 1, INT64_MAX);
  if (Fields::has(body, "temperature"))
    r.sampling.temperature = f.number(body["temperature"], "temperature", 0, 2);
  if (Fields::has(body, "top_p")) r.sampling.top_p = f.number(body["top_p"], "top_p", 0, 1);
  if (Fields::has(body, "top_k"))
    r.sampling.top_k = static_cast<int>(f.integer(body["top_k"], "top_k", -1, 1 << 30));
  if (Fields::has(body, "presence_penalty"))
    r.sampling.presence_penalty = f.number(body["presence_penalty"], "presence_penalty", -2, 2);
  if (Fields::has(body, "frequency_penalty"))
    r.sampling.frequency_penalty = f.number(body["frequency_penalty"], "frequency_penalty", -2, 2);
  if (Fields::has(body, "seed")) r.sampling.seed = f.integer(body["seed"], "seed", INT64_MIN, INT64_MAX);
  if (Fields::has(body, "n") && f.integer(body["n"], "n", 1, 128) != 1) f.fail("n", "only n=1 is supported");
  if (Fields::has(body, "stream")) r.stream = f.boolean(body["stream"], "stream");
  if (Fields::has(body, "stream_options")) {
    const Json& so = f.object(body["stream_options"], "stream_options");
    if (Fields::has(so, "include_usage"))
      r.include_usage = f.boolean(so["include_usage"], "stream_options.include_usage");
    if (Fields::has(so, "continuous_usage_stats"))
      r.continuous_usage = f.boolean(so["continuous_usage_stats"], "stream_options.continuous_usage_stats");
  }
  return r;
}

}  // namespace beluga::recipe
