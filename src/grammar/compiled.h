// A grammar compiled against one vocabulary: the automaton plus, for every automaton node with byte
// edges, its token mask cache (XGrammar's adaptive token mask cache). The cache is computed once per
// node by walking the vocabulary trie with a stack local to the node's rule:
//   accepted  - some thread survives all of the token's bytes inside the rule (or the rule ends exactly
//               at the token's end): allowed whatever the real stack is;
//   uncertain - the rule can end after the token's first k bytes (1 <= k < length): decided at mask
//               time by continuing with the real stack's caller (the `k` is stored with the token);
//   rejected  - everything else, context-independently.
// A rule ending before the first byte needs no entry: the matcher's closure already holds the caller's
// threads. The root rule, when nothing calls it, has no caller: its "uncertain" tokens are rejected.
// Each node stores the shorter of its accepted or rejected list; nodes whose masks are provably equal
// share one (mask_classes.h). Compiling is bounded by a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "grammar/automaton.h"
#include "grammar/grammar.h"
#include "grammar/vocab.h"

namespace beluga::grammar {

struct NodeMask {
  bool complement = false;   // ids lists the tokens NOT allowed (rejected and uncertain) instead
  std::vector<int32_t> ids;  // accepted (or, with complement, rejected + uncertain) token ids
  std::vector<std::pair<int32_t, int32_t>> uncertain;  // (token, bytes consumed when the rule ended)
};

struct CompiledGrammar {
  Automaton automaton;
  std::shared_ptr<const TokenVocab> vocab;
  std::vector<int32_t> mask_of_node;  // index into masks (shared by equal nodes), -1 without byte edges
  std::vector<NodeMask> masks;
  double compile_ms = 0;
};

struct CompileOptions {
  std::chrono::milliseconds timeout{10'000};
  CompileLimits limits;
  bool share_equal_masks = true;  // false: one vocabulary walk per node (the reference, for tests)
};

// Throws Refused when the grammar cannot be compiled (left recursion, too large, over the time limit).
std::shared_ptr<const CompiledGrammar> compile(const Grammar& g, std::shared_ptr<const TokenVocab> vocab,
                                               const CompileOptions& options = {});

// As compile(), for a caller that already spent part of the time budget (the front end).
std::shared_ptr<const CompiledGrammar> compile_until(const Grammar& g,
                                                     std::shared_ptr<const TokenVocab> vocab,
                                                     std::chrono::steady_clock::time_point deadline,
                                                     const CompileLimits& limits,
                                                     bool share_equal_masks = true);

}  // namespace beluga::grammar
