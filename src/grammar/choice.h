// The grammar of "exactly one of these strings" (vLLM's `structured_outputs.choice`): the output is
// one of the choices, byte for byte, and nothing else. Duplicates are harmless; an empty choice
// makes the empty output valid.
#pragma once

#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace beluga::grammar {

Grammar choice_grammar(const std::vector<std::string>& choices);

}  // namespace beluga::grammar
