// The grammar IR every front end (JSON Schema, later regex and GBNF) lowers to: a context-free grammar
// over bytes, XGrammar-style. A grammar is a list of rules; each rule's body is an expression tree of
// byte sets (one byte from a set), sequences, choices, bounded or unbounded repetitions and references
// to rules. Everything is bytes: UTF-8 and JSON escapes are spelled out as byte sequences by the front
// end, so the matcher never decodes characters and a character split across tokens needs no care.
//
// Expressions live in one arena (`exprs`) and are referred to by index, so front ends can share
// subexpressions freely (a tree in meaning, a DAG in memory). The automaton compiler (automaton.h)
// prunes unproductive alternatives and refuses left recursion.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace beluga::grammar {

struct ByteSet {
  uint64_t w[4] = {0, 0, 0, 0};
  void set(unsigned b) { w[b >> 6] |= uint64_t(1) << (b & 63); }
  void set_range(unsigned lo, unsigned hi) {
    for (unsigned b = lo; b <= hi; ++b) set(b);
  }
  void clear(unsigned b) { w[b >> 6] &= ~(uint64_t(1) << (b & 63)); }
  bool has(unsigned b) const { return (w[b >> 6] >> (b & 63)) & 1; }
  bool empty() const { return !(w[0] | w[1] | w[2] | w[3]); }
  static ByteSet range(unsigned lo, unsigned hi) {
    ByteSet s;
    s.set_range(lo, hi);
    return s;
  }
  static ByteSet of(std::string_view chars) {
    ByteSet s;
    for (unsigned char c : chars) s.set(c);
    return s;
  }
};

enum class ExprKind : uint8_t {
  kBytes,   // one byte from `bytes` (an empty set matches nothing)
  kSeq,     // kids in order (no kids: the empty string)
  kChoice,  // any one kid (no kids: nothing)
  kRef,     // the body of rule `rule`
  kRepeat,  // kids[0] repeated min..max times (max < 0: unbounded)
};

struct Expr {
  ExprKind kind = ExprKind::kSeq;
  ByteSet bytes;
  std::vector<int> kids;
  int rule = -1;
  int min = 0, max = -1;
};

struct Grammar {
  std::vector<Expr> exprs;
  std::vector<int> rule_body;  // expression per rule; -1 until defined
  std::vector<std::string> rule_names;
  int root = -1;  // the rule a whole output must match

  int add(Expr e) {
    exprs.push_back(std::move(e));
    return int(exprs.size()) - 1;
  }
  int bytes(const ByteSet& s) {
    Expr e;
    e.kind = ExprKind::kBytes;
    e.bytes = s;
    return add(std::move(e));
  }
  int byte(unsigned char c) { return bytes(ByteSet::range(c, c)); }
  int literal(std::string_view s);  // the exact byte string s
  int seq(std::vector<int> kids);
  int choice(std::vector<int> kids);
  int empty() { return seq({}); }
  int nothing() { return choice({}); }
  int optional(int e) { return repeat(e, 0, 1); }
  int repeat(int e, int min, int max);
  int ref(int rule) {
    Expr e;
    e.kind = ExprKind::kRef;
    e.rule = rule;
    return add(std::move(e));
  }
  int add_rule(std::string name) {
    rule_body.push_back(-1);
    rule_names.push_back(std::move(name));
    return int(rule_body.size()) - 1;
  }
  void define(int rule, int expr) { rule_body[rule] = expr; }

  // Human-readable EBNF-like dump, for debugging and tests.
  std::string to_string() const;
};

}  // namespace beluga::grammar
