// JSON Schema front end: a schema (drafts 4, 6, 7 and 2020-12) to the grammar of its valid instances,
// written as canonical JSON: compact (or at most `max_whitespace` whitespace bytes wherever JSON allows
// whitespace), strings with only the escapes a serializer needs (\" \\ \b \f \n \r \t and \u00XX for
// other control characters; everything else raw UTF-8), so each string has one spelling and "a key not
// among the declared ones" or an enum value is decidable byte by byte.
//
// Object properties: objects with at most 5 declared (or required) keys take them in any order;
// larger ones take declared keys in schema order, additional keys anywhere. Every keyword that is
// not enforced exactly is refused (Refused names it); annotations (title, description, default, ...)
// and keywords no draft knows are ignored, as the specification says. docs/structured-outputs.md lists
// what is supported and what is refused.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "grammar/grammar.h"

namespace beluga::grammar {

enum class Draft { k4, k6, k7, k2020 };

// "4", "6", "7", "2020-12" (also "draft-07" etc.); nullopt if unknown.
std::optional<Draft> parse_draft(std::string_view s);

struct JsonSchemaOptions {
  std::optional<Draft> draft;  // overrides $schema; neither: 2020-12
  int max_whitespace = 0;      // whitespace bytes allowed at each place JSON allows them
  size_t max_exprs = 4'000'000;
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

// Throws Refused for an unenforceable schema, beluga::Error for one that is not a valid schema.
Grammar json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});

}  // namespace beluga::grammar
