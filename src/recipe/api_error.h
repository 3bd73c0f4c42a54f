// API-shaped request errors: an HTTP status plus the error body of the API the client speaks.
// OpenAI APIs (chat, responses): {"error":{"message","type","param","code"}}; Anthropic Messages:
// {"type":"error","error":{"type","message"}}. Adapters throw ApiError; the server sends it as is.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "util/error.h"

namespace beluga::recipe {

enum class Api { kChat, kResponses, kMessages };

// "chat" | "responses" | "messages"
const char* api_name(Api api);

class ApiError : public Error {
 public:
  // `code`: the OpenAI body's `code` (empty: the error type, e.g. "invalid_request_error"); Anthropic
  // bodies have none.
  ApiError(Api api, int status, const std::string& message, const std::string& param = "",
           const std::string& code = "");
  int status() const { return status_; }
  const nlohmann::json& body() const { return body_; }

 private:
  int status_;
  nlohmann::json body_;
};

}  // namespace beluga::recipe
