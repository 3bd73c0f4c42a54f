#include "recipe/json_depth.h"

#include <string>
#include <utility>
#include <vector>

namespace beluga::recipe {

using Json = nlohmann::ordered_json;

int json_text_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escape = false;
  for (char c : text) {
    if (in_string) {
      if (escape)
        escape = false;
      else if (c == '\\')
        escape = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest && (deepest = depth) > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

int json_value_depth(const Json& v, int limit) {
  if (!v.is_structured()) return 0;
  // (container, its depth): an explicit stack, since the value may be as deep as the memory allows.
  std::vector<std::pair<const Json*, int>> stack{{&v, 1}};
  int deepest = 0;
  while (!stack.empty()) {
    auto [j, d] = stack.back();
    stack.pop_back();
    if (d > deepest && (deepest = d) > limit) return deepest;
    for (const Json& child : *j)
      if (child.is_structured()) stack.emplace_back(&child, d + 1);
  }
  return deepest;
}

Json parse_json_bounded(std::string_view text) {
  if (json_text_depth(text) > kMaxJsonDepth) return Json(Json::value_t::discarded);
  return Json::parse(text, nullptr, /*allow_exceptions=*/false);
}

namespace {

[[noreturn]] void too_deep(Api api) {
  throw ApiError(api, 400,
                 "the request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels");
}

}  // namespace

Json parse_request_json(Api api, std::string_view body) {
  // Before parsing: a deep body is refused without building its tree.
  if (json_text_depth(body) > kMaxJsonDepth) too_deep(api);
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw ApiError(api, 400, "the request body is not valid JSON");
  return j;
}

void check_request_depth(Api api, const Json& body) {
  if (json_value_depth(body) > kMaxJsonDepth) too_deep(api);
}

}  // namespace beluga::recipe
