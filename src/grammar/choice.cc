#include "grammar/choice.h"

namespace beluga::grammar {

Grammar choice_grammar(const std::vector<std::string>& choices) {
  Grammar g;
  g.root = g.add_rule("root");
  std::vector<int> alts;
  alts.reserve(choices.size());
  for (const auto& c : choices) alts.push_back(g.literal(c));
  g.define(g.root, g.choice(std::move(alts)));
  return g;
}

}  // namespace beluga::grammar
