#include "grammar/grammar.h"

#include <cstdio>

namespace beluga::grammar {

int Grammar::literal(std::string_view s) {
  if (s.size() == 1) return byte(static_cast<unsigned char>(s[0]));
  std::vector<int> kids;
  kids.reserve(s.size());
  for (unsigned char c : s) kids.push_back(byte(c));
  return seq(std::move(kids));
}

int Grammar::seq(std::vector<int> kids) {
  if (kids.size() == 1) return kids[0];
  Expr e;
  e.kind = ExprKind::kSeq;
  e.kids = std::move(kids);
  return add(std::move(e));
}

int Grammar::choice(std::vector<int> kids) {
  if (kids.size() == 1) return kids[0];
  Expr e;
  e.kind = ExprKind::kChoice;
  e.kids = std::move(kids);
  return add(std::move(e));
}

int Grammar::repeat(int kid, int min, int max) {
  if (min == 1 && max == 1) return kid;
  Expr e;
  e.kind = ExprKind::kRepeat;
  e.kids = {kid};
  e.min = min;
  e.max = max;
  return add(std::move(e));
}

namespace {

std::string byteset_string(const ByteSet& s) {
  std::string out = "[";
  for (unsigned b = 0; b < 256;) {
    if (!s.has(b)) {
      ++b;
      continue;
    }
    unsigned e = b;
    while (e + 1 < 256 && s.has(e + 1)) ++e;
    auto one = [&](unsigned c) {
      char buf[8];
      if (c >= 0x21 && c < 0x7f && c != ']' && c != '\\' && c != '-') {
        out += char(c);
      } else {
        std::snprintf(buf, sizeof buf, "\\x%02x", c);
        out += buf;
      }
    };
    one(b);
    if (e > b) {
      out += '-';
      one(e);
    }
    b = e + 1;
  }
  return out + "]";
}

void dump(const Grammar& g, int e, std::string& out) {
  const Expr& x = g.exprs[e];
  switch (x.kind) {
    case ExprKind::kBytes:
      out += byteset_string(x.bytes);
      break;
    case ExprKind::kSeq:
      out += "(";
      for (size_t i = 0; i < x.kids.size(); ++i) {
        if (i) out += " ";
        dump(g, x.kids[i], out);
      }
      out += ")";
      break;
    case ExprKind::kChoice:
      out += "(";
      for (size_t i = 0; i < x.kids.size(); ++i) {
        if (i) out += " | ";
        dump(g, x.kids[i], out);
      }
      if (x.kids.empty()) out += "NOTHING";
      out += ")";
      break;
    case ExprKind::kRef:
      out += g.rule_names[x.rule];
      break;
    case ExprKind::kRepeat:
      dump(g, x.kids[0], out);
      out += '{';
      out += std::to_string(x.min);
      out += ',';
      if (x.max >= 0) out += std::to_string(x.max);
      out += '}';
      break;
  }
}

}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  for (size_t r = 0; r < rule_body.size(); ++r) {
    out += rule_names[r];
    out += int(r) == root ? " (root) ::= " : " ::= ";
    if (rule_body[r] >= 0) dump(*this, rule_body[r], out);
    out += "\n";
  }
  return out;
}

}  // namespace beluga::grammar
