// Parsed API requests: request JSON of OpenAI Chat Completions, OpenAI Responses or Anthropic
// Messages -> a Conversation plus generation parameters. Invalid requests throw ApiError with the
// API's own status and body, naming the offending field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "recipe/api_error.h"
#include "recipe/conversation.h"
#include "recipe/output_constraint.h"

namespace beluga::recipe {

struct SamplingParams {
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int> top_k;
  std::optional<double> presence_penalty;
  std::optional<double> frequency_penalty;
  std::optional<int64_t> seed;
};

struct ParsedRequest {
  Api api = Api::kChat;
  std::string model;
  Conversation conversation;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::optional<int64_t> max_tokens;  // unset: the server's default
  bool stream = false;
  bool include_usage = false;     // chat stream_options.include_usage
  bool continuous_usage = false;  // chat stream_options.continuous_usage_stats (vLLM)
  // Responses: `store` (OpenAI's default: true) and the `previous_response_id` continued (or empty).
  bool store = true;
  std::string previous_response_id;
  // Structured output the request asks for (none: free text); compiled and enforced by the server.
  OutputConstraint constraint;
};

struct ParseOptions {
  bool default_thinking = false;  // thinking mode when the request does not say
  // Responses `previous_response_id`: the named response's conversation as Responses input items
  // (its input items, previous responses expanded, then its output items), which the caller looks
  // up (the server's response store). They come before the request's `input`; the stored
  // response's instructions do not apply (OpenAI semantics). Null while the request names a previous
  // response means no such response (for this caller): a 404 with param `previous_response_id`.
  nlohmann::ordered_json previous_items;
};

ParsedRequest parse_chat_request(const nlohmann::ordered_json& body, const ParseOptions& opt = {});
ParsedRequest parse_responses_request(const nlohmann::ordered_json& body, const ParseOptions& opt = {});
ParsedRequest parse_messages_request(const nlohmann::ordered_json& body, const ParseOptions& opt = {});
// A Responses `input` (a string or an item array) as an item array: a string is one user message.
nlohmann::ordered_json responses_input_items(const nlohmann::ordered_json& input);
// Parses the body text first (malformed JSON is a 400 in the API's shape).
ParsedRequest parse_request(Api api, std::string_view body, const ParseOptions& opt = {});

}  // namespace beluga::recipe
