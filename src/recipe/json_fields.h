// Typed access to request JSON fields for the API adapters: each getter checks the type and throws
// ApiError(400) naming the field path ("messages[2].content") in the API's error shape.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "recipe/api_error.h"
#include "recipe/conversation.h"

namespace beluga::recipe {

class Fields {
 public:
  explicit Fields(Api api) : api_(api) {}

  [[noreturn]] void fail(const std::string& path, const std::string& message) const;

  // Present and not null.
  static bool has(const nlohmann::ordered_json& obj, const char* key) {
    return obj.contains(key) && !obj[key].is_null();
  }
  const nlohmann::ordered_json& object(const nlohmann::ordered_json& v, const std::string& path) const;
  const nlohmann::ordered_json& array(const nlohmann::ordered_json& v, const std::string& path) const;
  std::string string(const nlohmann::ordered_json& v, const std::string& path) const;
  double number(const nlohmann::ordered_json& v, const std::string& path, double lo, double hi) const;
  int64_t integer(const nlohmann::ordered_json& v, const std::string& path, int64_t lo, int64_t hi) const;
  bool boolean(const nlohmann::ordered_json& v, const std::string& path) const;

  const nlohmann::ordered_json& required(const nlohmann::ordered_json& obj, const char* key,
                                         const std::string& path) const;
  // Stop sequences: a string or an array of at most `max` strings.
  std::vector<std::string> stop(const nlohmann::ordered_json& v, const std::string& path, size_t max) const;
  // A tool's parameter schema: an object (key order kept).
  nlohmann::ordered_json schema(const nlohmann::ordered_json& v, const std::string& path) const;
  // A function tool {name, description?, parameters?} whose fields sit in `fn` at `path`.
  Tool function_tool(const nlohmann::ordered_json& fn, const std::string& path) const;
  // A string tool_choice: "none", "auto" or "required".
  ToolChoice::Mode tool_choice_mode(const nlohmann::ordered_json& v, const std::string& path) const;
  // A named function choice must be one of the request's tools.
  void check_choice_in_tools(const Conversation& conv, const std::string& path) const;
  // Reasoning effort words of the public APIs -> Effort.
  Effort effort(const nlohmann::ordered_json& v, const std::string& path) const;

 private:
  Api api_;
};

std::string path_join(const std::string& base, const std::string& key);
std::string path_index(const std::string& base, size_t i);

}  // namespace beluga::recipe
