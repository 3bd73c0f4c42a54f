#include "recipe/json_fields.h"

#include <cmath>

namespace beluga::recipe {

using Json = nlohmann::ordered_json;

std::string path_join(const std::string& base, const std::string& key) {
  return base.empty() ? key : base + "." + key;
}
std::string path_index(const std::string& base, size_t i) {
  return base + "[" + std::to_string(i) + "]";
}

void Fields::fail(const std::string& path, const std::string& message) const {
  // Anthropic names fields as `path: message`; OpenAI puts the path in `param`.
  if (api_ == Api::kMessages) throw ApiError(api_, 400, path.empty() ? message : path + ": " + message);
  throw ApiError(api_, 400, path.empty() ? message : "Invalid '" + path + "': " + message, path);
}

const Json& Fields::object(const Json& v, const std::string& path) const {
  if (!v.is_object()) fail(path, "expected an object");
  return v;
}
const Json& Fields::array(const Json& v, const std::string& path) const {
  if (!v.is_array()) fail(path, "expected an array");
  return v;
}
std::string Fields::string(const Json& v, const std::string& path) const {
  if (!v.is_string()) fail(path, "expected a string");
  return v.get<std::string>();
}
double Fields::number(const Json& v, const std::string& path, double lo, double hi) const {
  if (!v.is_number()) fail(path, "expected a number");
  double x = v.get<double>();
  if (!(x >= lo && x <= hi))
    fail(path, "must be between " + Json(lo).dump() + " and " + Json(hi).dump() + ", got " + v.dump());
  return x;
}
int64_t Fields::integer(const Json& v, const std::string& path, int64_t lo, int64_t hi) const {
  if (!v.is_number_integer()) fail(path, "expected an integer");
  int64_t x =
      v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
  if (x < lo || x > hi) fail(path, "must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return x;
}
bool Fields::boolean(const Json& v, const std::string& path) const {
  if (!v.is_boolean()) fail(path, "expected a boolean");
  return v.get<bool>();
}
const Json& Fields::required(const Json& obj, const char* key, const std::string& path) const {
  if (!has(obj, key)) fail(path_join(path, key), "Field required");
  return obj[key];
}

std::vector<std::string> Fields::stop(const Json& v, const std::string& path, size_t max) const {
  std::vector<std::string> out;
  if (v.is_string()) {
    out.push_back(v.get<std::string>());
  } else if (v.is_array()) {
    if (v.size() > max) fail(path, "at most " + std::to_string(max) + " stop sequences are allowed");
    for (size_t i = 0; i < v.size(); ++i) out.push_back(string(v[i], path_index(path, i)));
  } else {
    fail(path, "expected a string or an array of strings");
  }
  return out;
}

Json Fields::schema(const Json& v, const std::string& path) const {
  if (!v.is_object()) fail(path, "expected a JSON Schema object");
  return v;
}

Effort Fields::effort(const Json& v, const std::string& path) const {
  std::string e = string(v, path);
  // The public DeepSeek mapping: minimal/low -> low, medium/high/xhigh -> high, max/ultra -> max.
  if (e == "minimal" || e == "low") return Effort::kLow;
  if (e == "medium" || e == "high" || e == "xhigh") return Effort::kHigh;
  if (e == "max" || e == "ultra") return Effort::kMax;
  fail(path, "unknown reasoning effort '" + e + "'");
}

Tool Fields::function_tool(const nlohmann::ordered_json& fn, const std::string& path) const {
  Tool tool;
  tool.name = string(required(fn, "name", path), path_join(path, "name"));
  if (tool.name.empty()) fail(path_join(path, "name"), "must not be empty");
  if (has(fn, "description")) tool.description = string(fn["description"], path_join(path, "description"));
  if (has(fn, "parameters")) tool.parameters = schema(fn["parameters"], path_join(path, "parameters"));
  return tool;
}

ToolChoice::Mode Fields::tool_choice_mode(const nlohmann::ordered_json& v, const std::string& path) const {
  const std::string s = string(v, path);
  if (s == "none") return ToolChoice::Mode::kNone;
  if (s == "auto") return ToolChoice::Mode::kAuto;
  if (s == "required") return ToolChoice::Mode::kRequired;
  fail(path, "must be 'none', 'auto', 'required' or a function");
}

void Fields::check_choice_in_tools(const Conversation& conv, const std::string& path) const {
  for (const auto& t : conv.tools)
    if (t.name == conv.tool_choice.function) return;
  fail(path, "function '" + conv.tool_choice.function + "' is not in 'tools'");
}

}  // namespace beluga::recipe
