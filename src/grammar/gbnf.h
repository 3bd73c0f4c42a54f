// Grammar-text front ends: llama.cpp's GBNF and the Lark subset vLLM's `structured_outputs.grammar`
// takes, both lowered to the grammar IR (characters are Unicode code points, written as UTF-8).
//
// GBNF: `name ::= alternatives` rules (a rule ends where the next `name ::=` begins; `#` comments),
// "literals" with \t \n \r \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH escapes, [classes] with ranges and
// [^negation], `.` (any character), rule names, ( groups ), postfix * + ? {m} {m,} {m,n} {,n};
// the whole output matches rule `root`.
// Lark subset: `rule: ...` and `TERMINAL: ...` (`?`/`!` prefixes and `.N` priorities accepted and
// ignored), "literals" and 'literals' (flag `i`: ASCII case-insensitive), "a".."z" ranges, /regex/
// (regex.h's dialect, no flags), [optional], ~ n and ~ n..m, `//` and `#` comments, `%import common.X`
// for the usual common.lark terminals; the output matches rule `start`. `%ignore` is refused (it
// would allow text between any two tokens), as is left recursion (by the automaton compiler).
// Malformed text is beluga::Error with line and column; unsupported constructs are Refused.
#pragma once

#include <cstddef>
#include <string_view>

#include "grammar/grammar.h"

namespace beluga::grammar {

struct GbnfOptions {
  int max_depth = 100;       // nested groups
  int max_repeat = 100'000;  // largest m, n in {m,n}
  size_t max_rules = 100'000;
};

Grammar from_gbnf(std::string_view text, const GbnfOptions& options = {});
Grammar from_lark(std::string_view text, const GbnfOptions& options = {});
// Either of the two, told apart by the first definition (`name ::=` is GBNF, `name:` is Lark).
Grammar from_ebnf(std::string_view text, const GbnfOptions& options = {});

}  // namespace beluga::grammar
