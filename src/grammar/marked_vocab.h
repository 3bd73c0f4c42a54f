// A vocabulary in which some special tokens may be generated under a grammar: a model's tool-call
// markers (`<｜tool▁calls▁begin｜>`, ...), which its tool-call markup is made of. Marker k stands for
// the two bytes marker_bytes(k) = 0xFF, k + 1; valid UTF-8 never holds 0xFF and ordinary tokens
// holding it are never allowed here, so a grammar's marker_bytes(k) can only be spelled by marker k
// itself, never by text that looks like it. Every other special token stays forbidden.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/vocab.h"

namespace beluga::grammar {

std::string marker_bytes(size_t k);  // k < 254

std::shared_ptr<const TokenVocab> marked_vocab(const TokenVocab& base, const std::vector<int>& markers);

}  // namespace beluga::grammar
