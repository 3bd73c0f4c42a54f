// A grammar compiled to one NFA per rule over bytes (Thompson construction), joined by call edges: a
// pushdown automaton. A node has byte-range edges, epsilon edges, at most one call (enter rule
// `call`, continue at `ret` when it ends), and the end node of each rule is `final`.
//
// compile() prunes alternatives that can derive no string (so every live matcher thread can still
// complete: a non-empty thread set means the input so far is a prefix of some sentence), and refuses
// left recursion (a rule reaching itself without consuming a byte) and grammars over the node limit
// or the deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "grammar/grammar.h"

namespace beluga::grammar {

struct Automaton {
  struct Edge {
    uint8_t lo, hi;
    int32_t to;
  };
  struct Node {
    int32_t rule = -1;
    uint32_t edge_begin = 0, edge_end = 0;  // into edges
    uint32_t eps_begin = 0, eps_end = 0;    // into eps
    int32_t call = -1, ret = -1;
    bool final = false;
    bool has_edges() const { return edge_end > edge_begin; }
  };
  std::vector<Node> nodes;
  std::vector<Edge> edges;
  std::vector<int32_t> eps;
  std::vector<int32_t> rule_start;  // -1 for a rule that derives nothing
  int32_t root = -1;
  bool root_called = false;  // some call edge enters the root rule
};

struct CompileLimits {
  size_t max_nodes = 2'000'000;
  // Determinizing a rule is bounded in states, but can still take long: over this, Refused.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

Automaton compile_automaton(const Grammar& g, const CompileLimits& limits = {});

}  // namespace beluga::grammar
