#include "server/utility_routes.h"

#include <climits>

#include "recipe/json_fields.h"
#include "server/sse.h"
#include "server/version.h"
#include "tokenizer/utf8.h"

namespace beluga::server {

namespace {

using Json = nlohmann::ordered_json;
using recipe::Api;
using recipe::ApiError;
using recipe::Fields;

UtilityReply reply(int status, const Json& body) {
  return UtilityReply{status, "application/json", dump_json(body)};
}

UtilityReply error_reply(const ApiError& e) {
  return UtilityReply{e.status(), "application/json",
                      e.body().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

Json parse_object(Api api, std::string_view body) {
  if (tok::utf8_first_invalid(body) != body.size())
    throw ApiError(api, 400, "the request body is not valid UTF-8");
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(api, 400, "the request body is not valid JSON");
  if (!j.is_object()) throw ApiError(api, 400, "the request body must be a JSON object");
  return j;
}

// The model facts with a context no prompt can exceed: counting a prompt must not fail for its length
// (the response reports max_model_len, and the client decides).
ModelInfo unbounded(const ModelInfo& info) {
  ModelInfo u = info;
  u.max_model_len = INT_MAX / 2;
  return u;
}

// Prompt ids as the generation route would submit them for `api` and `body`.
std::vector<int> prompt_ids(ServerApi api, const Json& body, const ModelInfo& info) {
  BuiltRequest b = build_request(api, dump_json(body), unbounded(info));
  return std::move(b.prompts.at(0));
}

// vLLM's POST /tokenize.
UtilityReply tokenize(std::string_view raw, const ModelInfo& info) {
  const Fields f(Api::kChat);
  Json body = parse_object(Api::kChat, raw);
  if (Fields::has(body, "return_token_strs") && f.boolean(body["return_token_strs"], "return_token_strs"))
    f.fail("return_token_strs", "token strings are not supported; detokenize the ids instead");
  const bool has_prompt = Fields::has(body, "prompt"), has_messages = Fields::has(body, "messages");
  if (has_prompt == has_messages)
    f.fail(has_prompt ? "messages" : "prompt", "send either `prompt` or `messages`");
  std::vector<int> ids;
  Json req = Json::object();
  if (Fields::has(body, "model")) req["model"] = body["model"];
  if (has_prompt) {
    // As /v1/completions encodes a text prompt (with the BOS token unless add_special_tokens is false).
    req["prompt"] = f.string(body["prompt"], "prompt");
    bool special = true;
    if (Fields::has(body, "add_special_tokens"))
      special = f.boolean(body["add_special_tokens"], "add_special_tokens");
    if (req["prompt"].get<std::string>().empty())
      ids = special && info.bos_token_id >= 0 ? std::vector<int>{info.bos_token_id} : std::vector<int>{};
    else
      ids = prompt_ids(ServerApi::kCompletions, req, info);
    if (!special && info.bos_token_id >= 0 && !ids.empty() && ids[0] == info.bos_token_id)
      ids.erase(ids.begin());
  } else {
    // As /v1/chat/completions encodes its conversation: the chat fields go through unchanged.
    for (const char* k : {"messages", "tools", "tool_choice", "response_format", "reasoning_effort",
                          "thinking", "chat_template_kwargs", "parallel_tool_calls"})
      if (body.contains(k)) req[k] = body[k];
    if (Fields::has(body, "add_generation_prompt") &&
        !f.boolean(body["add_generation_prompt"], "add_generation_prompt"))
      f.fail("add_generation_prompt",
             "only true is supported (the prompt ends where the assistant's turn begins)");
    if (Fields::has(body, "continue_final_message") &&
        f.boolean(body["continue_final_message"], "continue_final_message"))
      f.fail("continue_final_message", "not supported");
    ids = prompt_ids(ServerApi::kChat, req, info);
  }
  return reply(200, Json{{"count", ids.size()}, {"max_model_len", info.max_model_len}, {"tokens", ids}});
}

// vLLM's POST /detokenize.
UtilityReply detokenize(std::string_view raw, const ModelInfo& info) {
  const Fields f(Api::kChat);
  Json body = parse_object(Api::kChat, raw);
  if (Fields::has(body, "model") && f.string(body["model"], "model") != info.served_name)
    throw ApiError(Api::kChat, 404, "The model `" + body["model"].get<std::string>() + "` does not exist.",
                   "model");
  const Json& a = f.array(f.required(body, "tokens", ""), "tokens");
  const int64_t vocab = int64_t(info.tokenizer->vocab_size());
  std::vector<int> ids;
  ids.reserve(a.size());
  for (size_t i = 0; i < a.size(); ++i)
    ids.push_back(int(f.integer(a[i], recipe::path_index("tokens", i), 0, vocab - 1)));
  return reply(200, Json{{"prompt", info.tokenizer->decode(ids)}});
}

// Anthropic's POST /v1/messages/count_tokens: the prompt a Messages request would be (prompt caching
// changes nothing here).
UtilityReply count_tokens(std::string_view raw, const ModelInfo& info) {
  Json body = parse_object(Api::kMessages, raw);
  // count_tokens bodies have no max_tokens (Messages requires one): any budget gives the same prompt.
  if (!Fields::has(body, "max_tokens")) body["max_tokens"] = 1 << 30;
  body.erase("stream");
  const std::vector<int> ids = prompt_ids(ServerApi::kMessages, body, info);
  return reply(200, Json{{"input_tokens", ids.size()}});
}

}  // namespace

bool is_utility_route(std::string_view path) {
  return path == "/tokenize" || path == "/detokenize" || path == "/v1/messages/count_tokens" ||
         path == "/version";
}

UtilityReply handle_utility_route(std::string_view path, std::string_view method, std::string_view body,
                                  const ModelInfo* info) {
  const Api api = path == "/v1/messages/count_tokens" ? Api::kMessages : Api::kChat;
  const std::string p(path);
  try {
    if (path == "/version") {
      if (method != "GET") throw ApiError(api, 405, "use GET for " + p);
      return reply(200, Json{{"version", kVersion}});
    }
    if (method != "POST") throw ApiError(api, 405, "use POST for " + p);
    if (!info) throw ApiError(api, 503, "the model is loading");
    if (path == "/tokenize") return tokenize(body, *info);
    if (path == "/detokenize") return detokenize(body, *info);
    return count_tokens(body, *info);
  } catch (const ApiError& e) {
    return error_reply(e);
  } catch (const std::exception& e) {
    return error_reply(ApiError(api, 400, e.what()));
  }
}

}  // namespace beluga::server
