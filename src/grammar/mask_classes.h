// Automaton nodes whose token masks are provably equal, so the compiler walks the vocabulary once per
// class instead of once per node. A node's mask (compiled.h) depends only on which byte strings no
// longer than the longest token its rule accepts from it, and after which of their prefixes the rule
// may end. For nodes of rules that are plain DFAs (byte edges only: no epsilon edges, no calls), that
// is Moore's partition refinement run for `depth` rounds (the classes of `depth`-equivalence), started
// from (rule, final). This is what makes bounded repetitions cheap: positions of a `{m,M}` string
// farther than `depth` bytes from both bounds behave alike for every token and share one mask.
// Every other node is a class of its own. Nodes without byte edges get -1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "grammar/automaton.h"

namespace beluga::grammar {

struct MaskClasses {
  std::vector<int32_t> of_node;  // class per node, -1 for nodes without byte edges; ids 0, 1, ... in
                                 // the order of each class's first node
  int32_t count = 0;
};

MaskClasses mask_classes(const Automaton& a, size_t depth);

}  // namespace beluga::grammar
