#include "router/error_reply.h"

#include <nlohmann/json.hpp>

#include "recipe/api_error.h"

namespace beluga::router {

namespace {

recipe::Api api_of_path(std::string_view path) {
  if (path.starts_with("/v1/messages")) return recipe::Api::kMessages;
  if (path.starts_with("/v1/responses")) return recipe::Api::kResponses;
  return recipe::Api::kChat;
}

std::string dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

std::string error_body(std::string_view path, int status, const std::string& message) {
  return dump(recipe::ApiError(api_of_path(path), status, message).body());
}

std::string stream_error_events(std::string_view path, const std::string& message) {
  switch (api_of_path(path)) {
    case recipe::Api::kMessages:
      return "event: error\ndata: " +
             dump({{"type", "error"}, {"error", {{"type", "api_error"}, {"message", message}}}}) + "\n\n";
    case recipe::Api::kResponses:
      return "event: error\ndata: " +
             dump({{"type", "error"}, {"code", "server_error"}, {"message", message}, {"param", nullptr}}) +
             "\n\n";
    case recipe::Api::kChat:
      break;
  }
  return "data: " +
         dump({{"error",
                {{"message", message}, {"type", "internal_error"}, {"param", nullptr}, {"code", 502}}}}) +
         "\n\ndata: [DONE]\n\n";
}

}  // namespace beluga::router
