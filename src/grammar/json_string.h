// The bytes of one character inside a canonical JSON string: raw UTF-8 (well-formed, no surrogates)
// for everything but '"', '\' and control characters, which are written \" \\ \b \f \n \r \t or \u00XX
// (lowercase hex), as serializers do. One spelling per character makes string equality byte equality.
#pragma once

#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace beluga::grammar {

// One character (the unit minLength/maxLength count).
int json_string_char(Grammar& g);

// A whole string, quotes included, whose value is none of `excluded`; `rest` matches any characters
// and the closing quote (shared, see SchemaCompiler::string_rest).
int json_string_not_in(Grammar& g, const std::vector<std::string>& excluded, int rest);

}  // namespace beluga::grammar
