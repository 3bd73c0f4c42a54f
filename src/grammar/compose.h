// Building one grammar out of others: a front end's grammar (a tool's JSON Schema) becomes a rule of
// a larger one (the model's tool-call markup around it). Rule names keep their origin under `prefix`.
#pragma once

#include <string>

#include "grammar/grammar.h"

namespace beluga::grammar {

// Copies every expression and rule of `from` into `into` (renumbered) and returns the rule that
// `from.root` became.
int embed(Grammar& into, const Grammar& from, const std::string& prefix);

}  // namespace beluga::grammar
