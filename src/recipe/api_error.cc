#include "recipe/api_error.h"

namespace beluga::recipe {

namespace {

const char* error_type(Api api, int status) {
  if (api == Api::kMessages) {
    switch (status) {
      case 401:
        return "authentication_error";
      case 403:
        return "permission_error";
      case 404:
        return "not_found_error";
      case 413:
        return "request_too_large";
      case 429:
        return "rate_limit_error";
      case 503:
        return "overloaded_error";
      default:
        return status >= 500 ? "api_error" : "invalid_request_error";
    }
  }
  switch (status) {
    case 401:
      return "authentication_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    default:
      return status >= 500 ? "internal_error" : "invalid_request_error";
  }
}

nlohmann::json make_body(Api api, int status, const std::string& message, const std::string& param,
                         const std::string& code) {
  const char* type = error_type(api, status);
  if (api == Api::kMessages) return {{"type", "error"}, {"error", {{"type", type}, {"message", message}}}};
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
            {"code", code.empty() ? type : code}}}};
}

}  // namespace

const char* api_name(Api api) {
  switch (api) {
    case Api::kChat:
      return "chat";
    case Api::kResponses:
      return "responses";
    case Api::kMessages:
      return "messages";
  }
  return "?";
}

ApiError::ApiError(Api api, int status, const std::string& message, const std::string& param,
                   const std::string& code)
    : Error(message), status_(status), body_(make_body(api, status, message, param, code)) {}

}  // namespace beluga::recipe
