// The nesting limit for JSON that comes from outside (request bodies, JSON inside request strings,
// model-written tool arguments). Code that walks JSON recursively (py_json_dumps, nlohmann's dump and
// copy, the Jinja value conversion) relies on every such JSON value having passed through here, so
// that recursion is never deeper than kMaxJsonDepth levels.
//
// Depth counts containers: `1` and `"s"` are depth 0, `[]` and `{}` depth 1, `{"a": [1]}` depth 2.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "recipe/api_error.h"

namespace beluga::recipe {

inline constexpr int kMaxJsonDepth = 128;

// Deepest container nesting in JSON text, counting brackets outside string literals (one pass, no
// allocation); stops at `limit + 1`. Exact for valid JSON; for invalid text only an upper bound
// on what a parser could build from it.
int json_text_depth(std::string_view text, int limit = kMaxJsonDepth);
// Deepest container nesting of a parsed value (iterative); stops at `limit + 1`.
int json_value_depth(const nlohmann::ordered_json& v, int limit = kMaxJsonDepth);

// Parses JSON text nested at most kMaxJsonDepth deep; a discarded value when the text is not valid
// JSON or nests deeper.
nlohmann::ordered_json parse_json_bounded(std::string_view text);

// A request body: 400 in the API's shape when it is not valid JSON or nests deeper than the limit.
nlohmann::ordered_json parse_request_json(Api api, std::string_view body);
// The same limit on a request value parsed elsewhere (400 in the API's shape).
void check_request_depth(Api api, const nlohmann::ordered_json& body);

}  // namespace beluga::recipe
