// OpenAI Responses request -> ParsedRequest: `instructions`, `input` (a string or items: messages,
// function_call, function_call_output, reasoning) after the conversation of `previous_response_id`
// (looked up by the caller, see ParseOptions), `store`, function tools (web_search is dropped, as
// deepseek-recipe does), `reasoning.effort` (none disables thinking), `text.format`.
#include "recipe/json_depth.h"
#include "recipe/json_fields.h"
#include "recipe/py_json.h"
#include "recipe/request.h"

namespace beluga::recipe {

using Json = nlohmann::ordered_json;

namespace {

std::vector<ContentPart> input_content(const Fields& f, const Json& c, const std::string& path) {
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
    if (type == "input_text" || type == "output_text" || type == "text") {
      parts.push_back(
          {ContentPart::Kind::kText, f.string(f.required(part, "text", p), path_join(p, "text")), ""});
    } else if (type == "input_image") {
      parts.push_back({ContentPart::Kind::kImage, "",
                       f.string(f.required(part, "image_url", p), path_join(p, "image_url"))});
    } else {
      f.fail(path_join(p, "type"), "unsupported content type '" + type + "'");
    }
  }
  return parts;
}

// The assistant message that function calls and reasoning attach to (a new one when needed).
Message& open_assistant(Conversation& conv) {
  if (conv.messages.empty() || conv.messages.back().role != Role::kAssistant) {
    conv.messages.push_back(Message{Role::kAssistant, {}, {}, {}, {}, {}, false});
  }
  return conv.messages.back();
}

// Appends input items (messages, function calls and their outputs, reasoning) at `path` to `conv`.
void add_items(const Fields& f, Conversation& conv, const Json& items, const std::string& path) {
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string p = path_index(path, i);
    const Json& item = f.object(items[i], p);
    std::string type = Fields::has(item, "type") ? f.string(item["type"], path_join(p, "type")) : "message";
    if (type == "message") {
      std::string role = f.string(f.required(item, "role", p), path_join(p, "role"));
      Message m;
      if (role == "system" || role == "developer")
        m.role = Role::kSystem;
      else if (role == "user")
        m.role = Role::kUser;
      else if (role == "assistant")
        m.role = Role::kAssistant;
      else
        f.fail(path_join(p, "role"), "unknown role '" + role + "'");
      m.content = input_content(f, f.required(item, "content", p), path_join(p, "content"));
      if (m.role == Role::kAssistant) {
        Message& a = open_assistant(conv);  // joins a preceding reasoning item
        a.content.insert(a.content.end(), m.content.begin(), m.content.end());
      } else {
        conv.messages.push_back(std::move(m));
      }
    } else if (type == "function_call") {
      ToolCall tc;
      tc.id = f.string(f.required(item, "call_id", p), path_join(p, "call_id"));
      tc.name = f.string(f.required(item, "name", p), path_join(p, "name"));
      tc.arguments = f.string(f.required(item, "arguments", p), path_join(p, "arguments"));
      open_assistant(conv).tool_calls.push_back(std::move(tc));
    } else if (type == "function_call_output") {
      Message m;
      m.role = Role::kTool;
      m.tool_call_id = f.string(f.required(item, "call_id", p), path_join(p, "call_id"));
      const Json& out = f.required(item, "output", p);
      m.content = input_content(f, out, path_join(p, "output"));
      conv.messages.push_back(std::move(m));
    } else if (type == "reasoning") {
      std::string text;
      for (const char* key : {"content", "summary"}) {
        if (!Fields::has(item, key)) continue;
        const Json& parts = f.array(item[key], path_join(p, key));
        for (size_t k = 0; k < parts.size(); ++k) {
          const Json& part = f.object(parts[k], path_index(path_join(p, key), k));
          if (Fields::has(part, "text"))
            text += f.string(part["text"], path_index(path_join(p, key), k) + ".text");
        }
        if (!text.empty()) break;  // full reasoning text preferred over its summary
      }
      open_assistant(conv).reasoning += text;
    } else {
      f.fail(path_join(p, "type"), "unsupported input item type '" + type + "'");
    }
  }
}

}  // namespace

Json responses_input_items(const Json& input) {
  if (!input.is_string()) return input;
  return Json::array({Json{{"type", "message"},
                           {"role", "user"},
                           {"content", Json::array({Json{{"type", "input_text"}, {"text", input}}})}}});
}

ParsedRequest parse_responses_request(const Json& body, const ParseOptions& opt) {
  const Fields f(Api::kResponses);
  if (!body.is_object()) f.fail("", "the request body must be a JSON object");
  check_request_depth(Api::kResponses, body);  // before anything walks it recursively
  ParsedRequest r;
  r.api = Api::kResponses;
  Conversation& conv = r.conversation;
  conv.thinking = opt.default_thinking;
  if (Fields::has(body, "model")) r.model = f.string(body["model"], "model");
  if (Fields::has(body, "store")) r.store = f.boolean(body["store"], "store");
  if (Fields::has(body, "previous_response_id")) {
    r.previous_response_id = f.string(body["previous_response_id"], "previous_response_id");
    // OpenAI's answer for an id it does not have (or that another organization owns).
    if (!opt.previous_items.is_array())
      throw ApiError(Api::kResponses, 404,
                     "Previous response with id '" + r.previous_response_id + "' not found.",
                     "previous_response_id", "previous_response_not_found");
  }
  if (Fields::has(body, "instructions")) {
    conv.messages.push_back(
        Message{Role::kSystem,
                {{ContentPart::Kind::kText, f.string(body["instructions"], "instructions"), ""}},
                {},
                {},
                {},
                {},
                false});
  }
  // The previous response's conversation, then this request's input.
  if (Fields::has(body, "previous_response_id"))
    add_items(f, conv, opt.previous_items, "previous_response_id");
  const Json& input = f.required(body, "input", "");
  if (input.is_string()) {
    conv.messages.push_back(Message{
        Role::kUser, {{ContentPart::Kind::kText, input.get<std::string>(), ""}}, {}, {}, {}, {}, false});
  } else {
    f.array(input, "input");
    if (input.empty()) f.fail("input", "must not be empty");
    add_items(f, conv, input, "input");
  }
  if (Fields::has(body, "tools")) {
    const Json& tools = f.array(body["tools"], "tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string p = path_index("tools", i);
      const Json& t = f.object(tools[i], p);
      std::string type = f.string(f.required(t, "type", p), path_join(p, "type"));
      if (type == "web_search" || type == "web_search_preview") continue;  // server tool: ignored
      if (type != "function") f.fail(path_join(p, "type"), "unsupported tool type '" + type + "'");
      Tool tool = f.function_tool(t, p);
      conv.tools.push_back(std::move(tool));
    }
  }
  if (Fields::has(body, "tool_choice")) {
    const Json& tc = body["tool_choice"];
    if (tc.is_string()) {
      conv.tool_choice.mode = f.tool_choice_mode(tc, "tool_choice");
    } else {
      f.object(tc, "tool_choice");
      conv.tool_choice.mode = ToolChoice::Mode::kFunction;
      conv.tool_choice.function = f.string(f.required(tc, "name", "tool_choice"), "tool_choice.name");
      f.check_choice_in_tools(conv, "tool_choice");
    }
  }
  if (Fields::has(body, "reasoning")) {
    const Json& rs = f.object(body["reasoning"], "reasoning");
    if (Fields::has(rs, "effort")) {
      if (rs["effort"] == "none") {
        conv.thinking = false;
      } else {
        conv.effort = f.effort(rs["effort"], "reasoning.effort");
        conv.thinking = true;
      }
    }
  }
  if (Fields::has(body, "text")) {
    const Json& text = f.object(body["text"], "text");
    if (Fields::has(text, "format")) r.constraint = responses_text_format(f, text["format"], "text.format");
  }
  if (Fields::has(body, "structured_outputs"))  // vLLM's field
    merge_constraint(f, r.constraint,
                     vllm_structured_outputs(f, body["structured_outputs"], "structured_outputs"));
  conv.json_mode = r.constraint.kind == OutputConstraint::Kind::kJsonObject ||
                   r.constraint.kind == OutputConstraint::Kind::kJsonSchema;
  if (Fields::has(body, "max_output_tokens"))
    r.max_tokens = f.integer(body["max_output_tokens"], "max_output_tokens", 1, INT64_MAX);
  if (Fields::has(body, "temperature"))
    r.sampling.temperature = f.number(body["temperature"], "temperature", 0, 2);
  if (Fields::has(body, "top_p")) r.sampling.top_p = f.number(body["top_p"], "top_p", 0, 1);
  if (Fields::has(body, "stream")) r.stream = f.boolean(body["stream"], "stream");
  return r;
}

}  // namespace beluga::recipe
