// Regex front end: the ECMAScript (ECMA-262) subset that JSON Schema `pattern` and vLLM's
// `structured_outputs.regex` use, lowered to the grammar IR. Characters are Unicode code points (as
// with the `u` flag): literals and escapes (\t \n \v \f \r \0 \cX \xHH \uHHHH \u{H..} and escaped
// syntax characters), classes [..] and [^..] with ranges, \d \w \s and their negations, `.` (any
// character but \n \r U+2028 U+2029), alternation, groups ( ), (?: ), (?<name> ), quantifiers * + ?
// {n} {n,} {n,m} (lazy forms generate the same language), and ^ $ at the start / end of the pattern
// or of one of its top-level alternatives. Backreferences, lookaround, \b \B, property escapes and
// flags are refused (Refused names the construct); malformed patterns are beluga::Error with the
// column. Quantifier bounds and the lowered size are limited, so a pattern cannot blow up a compile.
#pragma once

#include <cstddef>
#include <string_view>

#include "grammar/grammar.h"

namespace beluga::grammar {

struct RegexOptions {
  size_t max_size = 200'000;  // characters and repetition copies in the lowered pattern
  int max_depth = 100;        // nested groups
  int max_repeat = 100'000;   // largest n, m in {n,m}
};

// The grammar of texts the whole of which matches `pattern` (what vLLM's `regex` means).
Grammar from_regex(std::string_view pattern, const RegexOptions& options = {});

// How a pattern is lowered into a grammar being built by another front end.
enum class RegexTarget {
  kText,        // raw UTF-8 text
  kJsonString,  // the body of a canonical JSON string (json_string.h), without the quotes
};

// Appends the expression of `pattern` to g. search: JSON Schema's unanchored meaning (some substring
// matches; ^ and $ anchor it); otherwise the whole input must match. `keyword` names the construct in
// errors and refusals ("regex", "pattern").
int regex_expr(Grammar& g, std::string_view pattern, RegexTarget target, bool search,
               std::string_view keyword = "regex", const RegexOptions& options = {});

}  // namespace beluga::grammar
