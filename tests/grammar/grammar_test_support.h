// Helpers the grammar front-end tests share: a grammar compiled to its automaton only (no token
// vocabulary), and whether a matcher accepts a whole text.
#pragma once

#include <memory>
#include <string_view>

#include "grammar/automaton.h"
#include "grammar/compiled.h"
#include "grammar/matcher.h"

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

}  // namespace beluga::grammar::testing
