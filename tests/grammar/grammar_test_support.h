// Helpers the grammar front-end tests share: a grammar compiled to its automaton only (no token
// vocabulary), whether a matcher accepts a whole text, and a JSON Schema's automaton or the keyword
// it is refused for.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "grammar/automaton.h"
#include "grammar/compiled.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/refused.h"

namespace beluga::grammar::testing {

inline std::shared_ptr<const CompiledGrammar> automaton_only(const Grammar& g) {
  auto cg = std::make_shared<CompiledGrammar>();
  cg->automaton = compile_automaton(g);
  return cg;
}

inline bool full(const std::shared_ptr<const CompiledGrammar>& g, std::string_view s) {
  Matcher m(g);
  return m.accept_bytes(s) && m.is_accepting();
}

inline std::shared_ptr<const CompiledGrammar> schema(const char* text) {
  return automaton_only(json_schema_grammar(nlohmann::ordered_json::parse(text)));
}

// The keyword a schema is refused for, or "" when it compiles.
inline std::string refused(const char* text) {
  try {
    schema(text);
  } catch (const Refused& r) {
    return r.keyword();
  }
  return "";
}

}  // namespace beluga::grammar::testing
