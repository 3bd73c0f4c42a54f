#include "grammar/automaton.h"

#include <algorithm>
#include <functional>
#include <map>

#include "grammar/refused.h"

namespace beluga::grammar {

namespace {

// Fixpoint over rules of a property of expressions (productive: derives some string; nullable: derives
// the empty string). `rule_val` is the current guess per rule, monotonically growing from false.
class RuleFixpoint {
 public:
  RuleFixpoint(const Grammar& g, bool nullable)
      : g_(g), nullable_(nullable), rule_val_(g.rule_body.size(), 0) {
    for (bool changed = true; changed;) {
      changed = false;
      memo_.assign(g.exprs.size(), -1);
      for (size_t r = 0; r < g.rule_body.size(); ++r) {
        if (rule_val_[r] || g.rule_body[r] < 0) continue;
        if (eval(g.rule_body[r])) rule_val_[r] = 1, changed = true;
      }
    }
    memo_.assign(g.exprs.size(), -1);
  }
  bool expr(int e) { return eval(e); }
  bool rule(int r) const { return rule_val_[r]; }

 private:
  bool eval(int e) {
    if (memo_[e] >= 0) return memo_[e];
    const Expr& x = g_.exprs[e];
    bool v = false;
    switch (x.kind) {
      case ExprKind::kBytes:
        v = !nullable_ && !x.bytes.empty();
        break;
      case ExprKind::kSeq:
        v = true;
        for (int k : x.kids) v = v && eval(k);
        break;
      case ExprKind::kChoice:
        for (int k : x.kids) v = eval(k) || v;
        break;
      case ExprKind::kRef:
        v = rule_val_[x.rule];
        break;
      case ExprKind::kRepeat:
        v = x.min == 0 || eval(x.kids[0]);  // both properties: the empty repetition, or one kid
        break;
    }
    memo_[e] = v;
    return v;
  }
  const Grammar& g_;
  bool nullable_;
  std::vector<uint8_t> rule_val_;
  std::vector<int8_t> memo_;
};

struct TmpNode {
  int32_t rule;
  std::vector<Automaton::Edge> edges;
  std::vector<int32_t> eps;
  int32_t call = -1, ret = -1;
  bool final = false;
};

class Builder {
 public:
  Builder(const Grammar& g, const CompileLimits& limits, RuleFixpoint& prod)
      : g_(g), limits_(limits), prod_(prod) {}

  Automaton run() {
    Automaton a;
    a.root = g_.root;
    a.rule_start.assign(g_.rule_body.size(), -1);
    for (size_t r = 0; r < g_.rule_body.size(); ++r) {
      if (!prod_.rule(int(r))) continue;
      rule_ = int32_t(r);
      size_t base = nodes_.size();
      int32_t start = node();
      a.rule_start[r] = start;
      int32_t end = build(g_.rule_body[r], start);
      nodes_[end].final = true;
      determinize(base);
    }
    for (const TmpNode& t : nodes_) {
      Automaton::Node n;
      n.rule = t.rule;
      n.edge_begin = uint32_t(a.edges.size());
      a.edges.insert(a.edges.end(), t.edges.begin(), t.edges.end());
      n.edge_end = uint32_t(a.edges.size());
      n.eps_begin = uint32_t(a.eps.size());
      a.eps.insert(a.eps.end(), t.eps.begin(), t.eps.end());
      n.eps_end = uint32_t(a.eps.size());
      n.call = t.call;
      n.ret = t.ret;
      n.final = t.final;
      if (n.call == a.root) a.root_called = true;
      a.nodes.push_back(n);
    }
    return a;
  }

 private:
  int32_t node() {
    if (nodes_.size() >= limits_.max_nodes)
      throw Refused("grammar-size", "the grammar is too large (over " + std::to_string(limits_.max_nodes) +
                                        " automaton states)");
    nodes_.push_back(TmpNode{rule_, {}, {}});
    return int32_t(nodes_.size()) - 1;
  }
  void eps(int32_t from, int32_t to) { nodes_[from].eps.push_back(to); }

  // Replaces the NFA of the rule built at nodes_[base, end) by an equivalent DFA when the rule calls no
  // other rule (lexemes: strings, numbers, formats): the matcher then holds one thread where the NFA
  // had one per open alternative, which makes mask walks through string bodies several times cheaper.
  void determinize(size_t base) {
    size_t n_nfa = nodes_.size() - base;
    for (size_t i = base; i < nodes_.size(); ++i)
      if (nodes_[i].call >= 0) return;
    auto closure = [&](std::vector<int32_t> set) {
      std::vector<int32_t> work = set;
      std::vector<uint8_t> in(n_nfa, 0);
      for (int32_t x : set) in[x - base] = 1;
      while (!work.empty()) {
        int32_t x = work.back();
        work.pop_back();
        for (int32_t y : nodes_[x].eps)
          if (!in[y - base]) in[y - base] = 1, work.push_back(y), set.push_back(y);
      }
      // Only nodes with byte edges and the end node matter for the future: keying states by them
      // merges the states that differ only in the epsilon nodes passed on the way.
      std::vector<int32_t> key;
      for (int32_t x : set)
        if (!nodes_[x].edges.empty() || nodes_[x].final) key.push_back(x);
      std::sort(key.begin(), key.end());
      return key;
    };
    std::map<std::vector<int32_t>, int32_t> index;
    std::vector<std::vector<int32_t>> states;
    std::vector<TmpNode> dfa;
    size_t cap = 2 * n_nfa + 64;
    auto state_of = [&](std::vector<int32_t> set) -> int32_t {
      auto it = index.find(set);
      if (it != index.end()) return it->second;
      int32_t id = int32_t(states.size());
      index.emplace(set, id);
      states.push_back(std::move(set));
      return id;
    };
    state_of(closure({int32_t(base)}));
    std::vector<int32_t> target(256);
    for (size_t q = 0; q < states.size(); ++q) {
      if (states.size() > cap) return;  // too many states: keep the NFA
      if ((q & 63) == 63 && std::chrono::steady_clock::now() > limits_.deadline)
        throw Refused("compile-time", "compiling the grammar exceeded the compile time limit");
      TmpNode t{rule_, {}, {}};
      std::vector<std::vector<int32_t>> next(256);
      for (int32_t x : states[q]) {
        if (nodes_[x].final) t.final = true;
        for (const auto& e : nodes_[x].edges)
          for (unsigned b = e.lo; b <= e.hi; ++b) next[b].push_back(e.to);
      }
      for (unsigned b = 0; b < 256; ++b) {
        if (b > 0 && next[b] == next[b - 1]) {
          target[b] = target[b - 1];
          continue;
        }
        target[b] = next[b].empty() ? -1 : state_of(closure(next[b]));
      }
      for (unsigned b = 0; b < 256;) {
        if (target[b] < 0) {
          ++b;
          continue;
        }
        unsigned hi = b;
        while (hi + 1 < 256 && target[hi + 1] == target[b]) ++hi;
        t.edges.push_back({uint8_t(b), uint8_t(hi), target[b]});  // state ids; rebased below
        b = hi + 1;
      }
      dfa.push_back(std::move(t));
    }
    nodes_.resize(base);
    for (TmpNode& t : dfa) {
      for (auto& e : t.edges) e.to += int32_t(base);
      nodes_.push_back(std::move(t));
    }
  }

  // Adds the NFA of productive expression e starting at node `from`; returns its end node.
  int32_t build(int e, int32_t from) {
    const Expr& x = g_.exprs[e];
    switch (x.kind) {
      case ExprKind::kBytes: {
        int32_t to = node();
        for (unsigned b = 0; b < 256;) {
          if (!x.bytes.has(b)) {
            ++b;
            continue;
          }
          unsigned hi = b;
          while (hi + 1 < 256 && x.bytes.has(hi + 1)) ++hi;
          nodes_[from].edges.push_back({uint8_t(b), uint8_t(hi), to});
          b = hi + 1;
        }
        return to;
      }
      case ExprKind::kSeq: {
        int32_t cur = from;
        for (int k : x.kids) cur = build(k, cur);
        return cur;
      }
      case ExprKind::kChoice: {
        int32_t end = node();
        for (int k : x.kids) {
          if (!prod_.expr(k)) continue;
          int32_t s = node();
          eps(from, s);
          eps(build(k, s), end);
        }
        return end;
      }
      case ExprKind::kRef: {
        int32_t c = node(), to = node();
        eps(from, c);
        nodes_[c].call = x.rule;
        nodes_[c].ret = to;
        return to;
      }
      case ExprKind::kRepeat: {
        int kid = x.kids[0];
        bool kid_ok = prod_.expr(kid);
        int32_t cur = from;
        if (!kid_ok) return cur;  // min == 0 here (else unproductive): only the empty repetition
        for (int i = 0; i < x.min; ++i) cur = build(kid, cur);
        if (x.max < 0) {
          int32_t loop = node();
          eps(cur, loop);
          int32_t s = node();
          eps(loop, s);
          eps(build(kid, s), loop);
          return loop;
        }
        // x{0,k} as (x (x (...)?)?)?: a copy is reachable only after the one before it, so the
        // repetition is unambiguous (skipping "copy 1" then taking "copy 2" would double the threads).
        if (x.max == x.min) return cur;
        int32_t end = node();
        for (int i = x.min; i < x.max; ++i) {
          eps(cur, end);
          int32_t s = node();
          eps(cur, s);
          cur = build(kid, s);
        }
        eps(cur, end);
        return end;
      }
    }
    return from;
  }

  const Grammar& g_;
  const CompileLimits& limits_;
  RuleFixpoint& prod_;
  std::vector<TmpNode> nodes_;
  int32_t rule_ = -1;
};

// Rules that rule r can enter before consuming a byte (through nullable prefixes).
void left_refs(const Grammar& g, int e, RuleFixpoint& nullable, RuleFixpoint& prod, std::vector<int>& out,
               std::vector<uint8_t>& seen) {
  if (seen[e]) return;
  seen[e] = 1;
  const Expr& x = g.exprs[e];
  switch (x.kind) {
    case ExprKind::kBytes:
      break;
    case ExprKind::kSeq:
      for (int k : x.kids) {
        left_refs(g, k, nullable, prod, out, seen);
        if (!nullable.expr(k)) break;
      }
      break;
    case ExprKind::kChoice:
      for (int k : x.kids)
        if (prod.expr(k)) left_refs(g, k, nullable, prod, out, seen);
      break;
    case ExprKind::kRef:
      if (prod.rule(x.rule)) out.push_back(x.rule);
      break;
    case ExprKind::kRepeat:
      if (x.max != 0 && prod.expr(x.kids[0])) left_refs(g, x.kids[0], nullable, prod, out, seen);
      break;
  }
}

}  // namespace

Automaton compile_automaton(const Grammar& g, const CompileLimits& limits) {
  BELUGA_ASSERT(g.root >= 0 && g.root < int(g.rule_body.size()));
  for (size_t r = 0; r < g.rule_body.size(); ++r)
    BELUGA_CHECK(g.rule_body[r] >= 0, "grammar rule '", g.rule_names[r], "' is used but never defined");
  RuleFixpoint prod(g, false), nullable(g, true);

  // Left recursion: a cycle in the "enters before consuming" graph would make the matcher's stack grow
  // without input.
  size_t n = g.rule_body.size();
  std::vector<std::vector<int>> left(n);
  for (size_t r = 0; r < n; ++r) {
    if (!prod.rule(int(r))) continue;
    std::vector<uint8_t> seen(g.exprs.size(), 0);
    left_refs(g, g.rule_body[r], nullable, prod, left[r], seen);
  }
  std::vector<uint8_t> color(n, 0);
  std::function<void(int)> visit = [&](int r) {
    color[r] = 1;
    for (int s : left[r]) {
      if (color[s] == 1)
        throw Refused("left-recursion",
                      "rule '" + g.rule_names[s] + "' refers to itself without consuming input");
      if (color[s] == 0) visit(s);
    }
    color[r] = 2;
  };
  for (size_t r = 0; r < n; ++r)
    if (color[r] == 0) visit(int(r));

  return Builder(g, limits, prod).run();
}

}  // namespace beluga::grammar
