#include "grammar/regex.h"

#include <algorithm>
#include <string>
#include <vector>

#include "grammar/char_set.h"
#include "grammar/json_string.h"
#include "grammar/refused.h"
#include "util/error.h"

namespace beluga::grammar {

namespace {

// The parsed pattern: a small tree of its own, so anchors can be checked and the size estimated
// before anything is written to the grammar.
struct Node {
  enum class Kind { kChars, kSeq, kAlt, kRepeat, kStart, kEnd } kind;
  CharSet chars;
  std::vector<int> kids;
  int min = 0, max = -1;
};

CharSet digit_set() {
  return CharSet::range('0', '9');
}
CharSet word_set() {
  CharSet s = CharSet::range('a', 'z');
  s.add('A', 'Z');
  s.add('0', '9');
  s.add('_');
  return s;
}
CharSet space_set() {  // ECMAScript WhiteSpace and LineTerminator
  CharSet s = CharSet::range('\t', '\r');
  for (uint32_t c : {0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) s.add(c);
  s.add(0x2000, 0x200A);
  return s;
}
CharSet dot_set() {  // everything but the line terminators
  CharSet s;
  s.add('\n');
  s.add('\r');
  s.add(0x2028, 0x2029);
  return s.complement();
}

class Parser {
 public:
  Parser(std::string_view p, std::string_view keyword, const RegexOptions& o)
      : p_(p), kw_(keyword), opt_(o) {}

  int parse(std::vector<Node>& out) {
    int root = alternation();
    if (i_ < p_.size()) syntax("unmatched ')'");
    out = std::move(nodes_);
    return root;
  }

 private:
  [[noreturn]] void syntax(const std::string& why) const {
    fail(kw_, ": ", why, " at column ", i_ + 1, " of ", quoted());
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    throw Refused(std::string(kw_), str(kw_, ": ", what, " (at column ", i_ + 1, " of ", quoted(),
                                        ") cannot be enforced by a grammar and are not supported"));
  }
  std::string quoted() const {
    std::string s(p_.substr(0, 80));
    return "/" + s + (p_.size() > 80 ? "..." : "") + "/";
  }
  bool eof() const { return i_ >= p_.size(); }
  char peek(size_t k = 0) const { return i_ + k < p_.size() ? p_[i_ + k] : '\0'; }
  int add(Node n) {
    nodes_.push_back(std::move(n));
    return int(nodes_.size()) - 1;
  }
  int chars(CharSet s) { return add(Node{Node::Kind::kChars, std::move(s), {}}); }

  int alternation() {
    std::vector<int> branches = {sequence()};
    while (peek() == '|' && !eof()) {
      ++i_;
      branches.push_back(sequence());
    }
    if (branches.size() == 1) return branches[0];
    return add(Node{Node::Kind::kAlt, {}, std::move(branches)});
  }

  int sequence() {
    std::vector<int> items;
    while (!eof() && peek() != '|' && peek() != ')') items.push_back(term());
    return add(Node{Node::Kind::kSeq, {}, std::move(items)});
  }

  int term() {
    char c = peek();
    if (c == '^' || c == '$') {
      ++i_;
      int n = add(Node{c == '^' ? Node::Kind::kStart : Node::Kind::kEnd, {}, {}});
      if (quantifier_here()) syntax("nothing to repeat (a quantifier after an anchor)");
      return n;
    }
    int a = atom();
    int min, max;
    if (quantifier(min, max)) {
      if (peek() == '?') ++i_;  // lazy: the same strings
      a = add(Node{Node::Kind::kRepeat, {}, {a}, min, max});
      if (quantifier_here()) syntax("nothing to repeat (two quantifiers in a row)");
    }
    return a;
  }

  bool quantifier_here() {
    size_t save = i_;
    int min, max;
    bool q = quantifier(min, max);
    i_ = save;
    return q;
  }

  // * + ? {n} {n,} {n,m}; a '{' that does not start one of these is a literal (Annex B).
  bool quantifier(int& min, int& max) {
    char c = peek();
    if (eof()) return false;
    if (c == '*') return ++i_, min = 0, max = -1, true;
    if (c == '+') return ++i_, min = 1, max = -1, true;
    if (c == '?') return ++i_, min = 0, max = 1, true;
    if (c != '{') return false;
    size_t j = i_ + 1;
    auto number = [&](long& v) {
      size_t s = j;
      v = 0;
      while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9') {
        v = std::min<long>(v * 10 + (p_[j] - '0'), 1L << 40);
        ++j;
      }
      return j > s;
    };
    long lo, hi = -1;
    if (!number(lo)) return false;
    if (j < p_.size() && p_[j] == ',') {
      ++j;
      if (!number(hi)) hi = -1;
    } else {
      hi = lo;
    }
    if (j >= p_.size() || p_[j] != '}') return false;
    if (hi >= 0 && hi < lo) syntax("numbers out of order in {} quantifier");
    if (lo > opt_.max_repeat || hi > opt_.max_repeat)
      throw Refused(std::string(kw_), str(kw_, ": a repetition count above ", opt_.max_repeat,
                                          " is not supported (", quoted(), ")"));
    i_ = j + 1;
    min = int(lo);
    max = int(hi);
    return true;
  }

  int atom() {
    char c = peek();
    switch (c) {
      case '(':
        return group();
      case '[':
        return char_class();
      case '.':
        ++i_;
        return chars(dot_set());
      case '\\': {
        if (i_ + 1 >= p_.size()) syntax("\\ at end of pattern");
        char e = peek(1);
        if (e == 'b' || e == 'B') unsupported("word boundary assertions (\\b, \\B)");
        if (e >= '1' && e <= '9') unsupported("backreferences (\\1 ...)");
        if (e == 'k') unsupported("named backreferences (\\k<name>)");
        ++i_;
        return chars(escape());
      }
      case '*':
      case '+':
      case '?':
        syntax("nothing to repeat");
      case '{':
        if (quantifier_here()) syntax("nothing to repeat");
        break;
      default:
        break;
    }
    uint32_t cp = literal();
    return chars(CharSet::range(cp, cp));
  }

  // One literal code point of the pattern (UTF-8).
  uint32_t literal() {
    uint32_t cp;
    if (!decode_utf8(p_, i_, cp)) syntax("invalid UTF-8");
    return cp;
  }

  int group() {
    ++i_;  // '('
    if (++depth_ > opt_.max_depth)
      throw Refused(std::string(kw_),
                    str(kw_, ": groups nest deeper than ", opt_.max_depth, " (", quoted(), ")"));
    if (peek() == '?') {
      char k = peek(1);
      if (k == ':') {
        i_ += 2;
      } else if (k == '=' || k == '!') {
        unsupported("lookahead assertions ((?=...), (?!...))");
      } else if (k == '<' && (peek(2) == '=' || peek(2) == '!')) {
        unsupported("lookbehind assertions ((?<=...), (?<!...))");
      } else if (k == '<') {
        size_t j = i_ + 2;
        while (j < p_.size() && p_[j] != '>' && p_[j] != ')') ++j;
        if (j >= p_.size() || p_[j] != '>' || j == i_ + 2) syntax("invalid group name");
        i_ = j + 1;
      } else {
        if (k == 'i' || k == 'm' || k == 's' || k == 'x' || k == '-') unsupported("inline flags ((?i) ...)");
        syntax("invalid group");
      }
    }
    int body = alternation();
    if (peek() != ')' || eof()) syntax("unterminated group");
    ++i_;
    --depth_;
    return body;
  }

  int char_class() {
    ++i_;  // '['
    bool negate = false;
    if (peek() == '^' && !eof()) negate = true, ++i_;
    CharSet set;
    while (true) {
      if (eof()) syntax("unterminated character class");
      if (peek() == ']') {
        ++i_;
        break;
      }
      bool a_set;
      CharSet a = class_atom(a_set);
      if (peek() == '-' && i_ + 1 < p_.size() && peek(1) != ']') {
        ++i_;
        bool b_set;
        CharSet b = class_atom(b_set);
        if (a_set || b_set) syntax("a class escape (\\d, \\w, \\s) cannot bound a range");
        uint32_t lo = a.ranges()[0].first, hi = b.ranges()[0].first;
        if (lo > hi) syntax("range out of order in character class");
        set.add(lo, hi);
      } else {
        set.add(a);
      }
    }
    return chars(negate ? set.complement() : set);
  }

  // One member of a class: a character (is_set false: one range of one code point) or a class escape.
  CharSet class_atom(bool& is_set) {
    is_set = false;
    if (peek() != '\\') {
      uint32_t c = literal();
      return CharSet::range(c, c);
    }
    ++i_;
    if (eof()) syntax("\\ at end of pattern");
    char e = peek();
    if (e == 'b') return ++i_, CharSet::range(8, 8);
    if (e == '-') return ++i_, CharSet::range('-', '-');
    if (e >= '1' && e <= '9') unsupported("backreferences and octal escapes (\\1 ...)");
    is_set = std::string_view("dDwWsS").find(e) != std::string_view::npos;
    return escape();
  }

  // After a backslash (not \b \B \1-\9): a class escape or one character.
  CharSet escape() {
    char e = peek();
    ++i_;
    auto one = [](uint32_t c) { return CharSet::range(c, c); };
    switch (e) {
      case 'd':
        return digit_set();
      case 'D':
        return digit_set().complement();
      case 'w':
        return word_set();
      case 'W':
        return word_set().complement();
      case 's':
        return space_set();
      case 'S':
        return space_set().complement();
      case 't':
        return one('\t');
      case 'n':
        return one('\n');
      case 'v':
        return one('\v');
      case 'f':
        return one('\f');
      case 'r':
        return one('\r');
      case '0':
        if (peek() >= '0' && peek() <= '9') unsupported("octal escapes (\\0N)");
        return one(0);
      case 'c': {
        char l = peek();
        if (!((l >= 'a' && l <= 'z') || (l >= 'A' && l <= 'Z'))) syntax("\\c must be followed by a letter");
        ++i_;
        return one(uint32_t(l) % 32);
      }
      case 'x':
        return one(hex(2, "\\x"));
      case 'u':
        return one(unicode_escape());
      case 'p':
      case 'P':
        unsupported("Unicode property escapes (\\p{...}, \\P{...})");
      default:
        break;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9') || e == '_')
      syntax(std::string("unknown escape \\") + e);
    --i_;  // an escaped punctuation or non-ASCII character stands for itself
    uint32_t c = literal();
    return one(c);
  }

  uint32_t hex(int n, const char* what) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      char c = peek();
      int d = c >= '0' && c <= '9'   ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                     : -1;
      if (d < 0 || eof()) syntax(std::string("invalid ") + what + " escape");
      v = v * 16 + uint32_t(d);
      ++i_;
    }
    return v;
  }

  uint32_t unicode_escape() {
    uint32_t c;
    if (peek() == '{') {
      ++i_;
      c = 0;
      int n = 0;
      while (!eof() && peek() != '}') {
        c = std::min<uint32_t>(c * 16 + hex(1, "\\u{...}"), 0x110000);
        ++n;
      }
      if (eof() || n == 0 || c > kMaxCodePoint) syntax("invalid \\u{...} escape");
      ++i_;
    } else {
      c = hex(4, "\\u");
      if (c >= 0xD800 && c <= 0xDBFF && peek() == '\\' && peek(1) == 'u') {  // a surrogate pair
        size_t save = i_;
        i_ += 2;
        uint32_t lo = hex(4, "\\u");
        if (lo >= 0xDC00 && lo <= 0xDFFF) return 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
        i_ = save;
      }
    }
    if (c >= 0xD800 && c <= 0xDFFF) syntax("a lone surrogate cannot appear in UTF-8 text");
    return c;
  }

  std::string_view p_, kw_;
  const RegexOptions& opt_;
  size_t i_ = 0;
  int depth_ = 0;
  std::vector<Node> nodes_;
};

class Lowerer {
 public:
  Lowerer(Grammar& g, const std::vector<Node>& nodes, RegexTarget target, std::string_view kw)
      : g_(g), nodes_(nodes), target_(target), kw_(kw) {}

  // Characters and repetition copies, saturating just above `cap`.
  size_t weight(int n, size_t cap) const {
    const Node& x = nodes_[n];
    switch (x.kind) {
      case Node::Kind::kChars:
        return std::max<size_t>(1, x.chars.ranges().size());
      case Node::Kind::kRepeat: {
        size_t k = weight(x.kids[0], cap);
        size_t copies = size_t(x.max >= 0 ? x.max : x.min + 1);
        return copies == 0 ? 1 : (k > cap / copies ? cap + 1 : k * copies);
      }
      default: {
        size_t s = 1;
        for (int k : x.kids) s = std::min(cap + 1, s + weight(k, cap));
        return s;
      }
    }
  }

  int top(int root, bool search) {
    const Node& r = nodes_[root];
    std::vector<int> branches = r.kind == Node::Kind::kAlt ? r.kids : std::vector<int>{root};
    std::vector<int> alts;
    for (int b : branches) {
      std::vector<int> items = nodes_[b].kind == Node::Kind::kSeq ? nodes_[b].kids : std::vector<int>{b};
      bool start = false, end = false;
      size_t lo = 0, hi = items.size();
      while (lo < hi && nodes_[items[lo]].kind == Node::Kind::kStart) start = true, ++lo;
      while (hi > lo && nodes_[items[hi - 1]].kind == Node::Kind::kEnd) end = true, --hi;
      std::vector<int> parts;
      if (search && !start) parts.push_back(g_.repeat(any_char(), 0, -1));
      for (size_t k = lo; k < hi; ++k) parts.push_back(lower(items[k]));
      if (search && !end) parts.push_back(g_.repeat(any_char(), 0, -1));
      alts.push_back(parts.empty() ? g_.empty() : g_.seq(std::move(parts)));
    }
    return g_.choice(std::move(alts));
  }

 private:
  int any_char() {
    if (any_ < 0)
      any_ = target_ == RegexTarget::kJsonString ? json_string_char(g_) : utf8_chars(g_, CharSet::all());
    return any_;
  }
  int lower(int n) {
    const Node& x = nodes_[n];
    switch (x.kind) {
      case Node::Kind::kChars:
        return target_ == RegexTarget::kJsonString ? json_string_chars(g_, x.chars) : utf8_chars(g_, x.chars);
      case Node::Kind::kSeq: {
        std::vector<int> kids;
        for (int k : x.kids) kids.push_back(lower(k));
        return kids.empty() ? g_.empty() : g_.seq(std::move(kids));
      }
      case Node::Kind::kAlt: {
        std::vector<int> kids;
        for (int k : x.kids) kids.push_back(lower(k));
        return g_.choice(std::move(kids));
      }
      case Node::Kind::kRepeat:
        if (x.max == 0) return g_.empty();
        return g_.repeat(lower(x.kids[0]), x.min, x.max);
      case Node::Kind::kStart:
      case Node::Kind::kEnd:
        break;
    }
    throw Refused(std::string(kw_), str(kw_,
                                        ": ^ and $ are supported only at the start and end of the pattern "
                                        "or of one of its top-level alternatives"));
  }

  Grammar& g_;
  const std::vector<Node>& nodes_;
  RegexTarget target_;
  std::string_view kw_;
  int any_ = -1;
};

}  // namespace

int regex_expr(Grammar& g, std::string_view pattern, RegexTarget target, bool search,
               std::string_view keyword, const RegexOptions& options) {
  std::vector<Node> nodes;
  int root = Parser(pattern, keyword, options).parse(nodes);
  Lowerer low(g, nodes, target, keyword);
  if (low.weight(root, options.max_size) > options.max_size)
    throw Refused(std::string(keyword), str(keyword, ": the pattern is too large (over ", options.max_size,
                                            " characters and repetition copies)"));
  return low.top(root, search);
}

Grammar from_regex(std::string_view pattern, const RegexOptions& options) {
  Grammar g;
  int r = g.add_rule("root");
  g.root = r;
  g.define(r, regex_expr(g, pattern, RegexTarget::kText, /*search=*/false, "regex", options));
  return g;
}

}  // namespace beluga::grammar
