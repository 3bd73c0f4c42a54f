#include "grammar/compose.h"

#include "util/error.h"

namespace beluga::grammar {

int embed(Grammar& into, const Grammar& from, const std::string& prefix) {
  BELUGA_CHECK(from.root >= 0, "embedding a grammar without a root rule");
  const int expr_base = int(into.exprs.size());
  const int rule_base = int(into.rule_body.size());
  into.exprs.reserve(into.exprs.size() + from.exprs.size());
  for (Expr e : from.exprs) {
    for (int& k : e.kids) k += expr_base;
    if (e.kind == ExprKind::kRef) e.rule += rule_base;
    into.exprs.push_back(std::move(e));
  }
  for (size_t r = 0; r < from.rule_body.size(); ++r) {
    into.add_rule(prefix + from.rule_names[r]);
    if (from.rule_body[r] >= 0) into.define(rule_base + int(r), from.rule_body[r] + expr_base);
  }
  return from.root + rule_base;
}

}  // namespace beluga::grammar
