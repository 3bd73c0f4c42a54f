// The utility endpoints beside the generation APIs, in the shapes clients already know:
//   POST /tokenize                 vLLM's: {prompt} or {messages, tools, ...} -> {count, max_model_len,
//   tokens} POST /detokenize               vLLM's: {tokens} -> {prompt} POST /v1/messages/count_tokens
//   Anthropic's: a Messages request body -> {input_tokens} GET  /version                  {version}
//   (beluga::kVersion, what `beluga --version` prints)
// Text is encoded exactly as a generation request's prompt is (request_builder.h: the same request
// building, so special-token strings typed by a user stay text). Errors come in the route's API shape
// (OpenAI's; Anthropic's for count_tokens). The caller checks the API key.
#pragma once

#include <string>
#include <string_view>

#include "server/request_builder.h"

namespace beluga::server {

struct UtilityReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

bool is_utility_route(std::string_view path);

// `method`: "GET", "POST", ... `info`: null while the model loads (then only /version answers; the
// others 503).
UtilityReply handle_utility_route(std::string_view path, std::string_view method, std::string_view body,
                                  const ModelInfo* info);

}  // namespace beluga::server
