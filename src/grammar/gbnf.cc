#include "grammar/gbnf.h"

#include <map>
#include <string>
#include <vector>

#include "grammar/char_set.h"
#include "grammar/refused.h"
#include "grammar/regex.h"
#include "util/error.h"

namespace beluga::grammar {

namespace {

enum class Dialect { kGbnf, kLark };

// Lark's common.lark terminals that `%import common.X` brings in, as regex.h patterns.
const std::map<std::string, std::string>& lark_common() {
  static const std::map<std::string, std::string> m = {
      {"DIGIT", "[0-9]"},
      {"HEXDIGIT", "[a-fA-F0-9]"},
      {"INT", "[0-9]+"},
      {"SIGNED_INT", "[+-]?[0-9]+"},
      {"DECIMAL", "[0-9]+\\.[0-9]*|\\.[0-9]+"},
      {"FLOAT", "[0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?"},
      {"SIGNED_FLOAT", "[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?)"},
      {"NUMBER", "[0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+"},
      {"SIGNED_NUMBER", "[+-]?([0-9]+[eE][+-]?[0-9]+|([0-9]+\\.[0-9]*|\\.[0-9]+)([eE][+-]?[0-9]+)?|[0-9]+)"},
      {"ESCAPED_STRING", "\"([^\"\\\\\\n]|\\\\[^\\n])*\""},
      {"LCASE_LETTER", "[a-z]"},
      {"UCASE_LETTER", "[A-Z]"},
      {"LETTER", "[A-Za-z]"},
      {"WORD", "[A-Za-z]+"},
      {"CNAME", "[_A-Za-z][_A-Za-z0-9]*"},
      {"WS_INLINE", "[ \\t]+"},
      {"WS", "[ \\t\\f\\r\\n]+"},
      {"CR", "\\r"},
      {"LF", "\\n"},
      {"NEWLINE", "(\\r?\\n)+"},
  };
  return m;
}

class TextGrammarParser {
 public:
  TextGrammarParser(std::string_view text, Dialect d, const GbnfOptions& o) : t_(text), d_(d), opt_(o) {}

  Grammar run() {
    skip_space();
    while (!eof()) {
      definition();
      skip_space();
    }
    const char* root_name = d_ == Dialect::kGbnf ? "root" : "start";
    auto it = rules_.find(root_name);
    if (it == rules_.end() || g_.rule_body[it->second] < 0)
      fail(what(), ": no '", root_name, "' rule (the whole output matches it)");
    for (auto& [name, r] : rules_)
      if (g_.rule_body[r] < 0) syntax(first_use_[r], "undefined rule '" + name + "'");
    g_.root = it->second;
    return std::move(g_);
  }

 private:
  const char* what() const { return d_ == Dialect::kGbnf ? "gbnf" : "lark grammar"; }
  std::string where(size_t pos) const {
    size_t line = 1, col = 1;
    for (size_t k = 0; k < pos && k < t_.size(); ++k) {
      if (t_[k] == '\n')
        ++line, col = 1;
      else if ((uint8_t(t_[k]) & 0xC0) != 0x80)
        ++col;
    }
    return str("line ", line, ", column ", col);
  }
  [[noreturn]] void syntax(size_t pos, const std::string& why) const {
    fail(what(), ": ", where(pos), ": ", why);
  }
  [[noreturn]] void unsupported(size_t pos, const std::string& what_) const {
    throw Refused(d_ == Dialect::kGbnf ? "gbnf" : "lark",
                  str(what(), ": ", where(pos), ": ", what_, " is not supported"));
  }
  bool eof() const { return i_ >= t_.size(); }
  char peek(size_t k = 0) const { return i_ + k < t_.size() ? t_[i_ + k] : '\0'; }
  bool lark() const { return d_ == Dialect::kLark; }

  void skip_inline_space() {
    while (!eof() && (peek() == ' ' || peek() == '\t' || peek() == '\r')) ++i_;
  }
  void skip_space() {
    while (!eof()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\r' || c == '\n') {
        ++i_;
      } else if (c == '#' || (lark() && c == '/' && peek(1) == '/')) {
        while (!eof() && peek() != '\n') ++i_;
      } else {
        break;
      }
    }
  }

  static bool name_char(char c, Dialect d) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           (c == '-' && d == Dialect::kGbnf);
  }
  std::string name() {
    size_t s = i_;
    while (!eof() && name_char(peek(), d_)) ++i_;
    return std::string(t_.substr(s, i_ - s));
  }

  // Whether a definition (`name ::=`, `?name.2 :`, or a %directive) starts at the current position.
  bool at_definition() {
    if (lark() && peek() == '%') return true;
    size_t save = i_;
    if (lark() && (peek() == '?' || peek() == '!')) ++i_;
    bool yes = !name().empty();
    if (yes && lark() && peek() == '.' && peek(1) >= '0' && peek(1) <= '9') {
      ++i_;
      while (peek() >= '0' && peek() <= '9') ++i_;
    }
    skip_inline_space();
    yes = yes && (lark() ? peek() == ':' : t_.substr(i_, 3) == "::=");
    i_ = save;
    return yes;
  }

  int rule_id(const std::string& n, size_t pos) {
    auto it = rules_.find(n);
    if (it != rules_.end()) return it->second;
    if (rules_.size() >= opt_.max_rules) unsupported(pos, "a grammar with this many rules");
    int r = g_.add_rule(n);
    rules_[n] = r;
    first_use_[r] = pos;
    return r;
  }

  void define(int r, int body, size_t pos, const std::string& n) {
    if (g_.rule_body[r] >= 0)
      syntax(pos, "rule '" + n + "' is defined twice (first at " + where(defined_at_[r]) + ")");
    g_.define(r, body);
    defined_at_[r] = pos;
  }

  void definition() {
    size_t pos = i_;
    if (lark() && peek() == '%') return directive();
    if (lark() && (peek() == '?' || peek() == '!')) ++i_;
    std::string n = name();
    if (n.empty() && (peek() == ')' || peek() == ']' || peek() == '|'))
      syntax(pos, std::string("unexpected '") + peek() + "'");
    if (n.empty())
      syntax(pos,
             lark() ? "expected a rule definition (name: ...)" : "expected a rule definition (name ::= ...)");
    if (lark() && peek() == '.') {
      ++i_;
      while (peek() >= '0' && peek() <= '9') ++i_;
    }
    skip_inline_space();
    if (lark() ? peek() != ':' : t_.substr(i_, 3) != "::=")
      syntax(i_, lark() ? "expected ':' after the rule name" : "expected '::=' after the rule name");
    i_ += lark() ? 1 : 3;
    int r = rule_id(n, pos);
    define(r, alternates(0), pos, n);
  }

  // %import common.X, %import common (X, Y); everything else is refused.
  void directive() {
    size_t pos = i_;
    ++i_;
    std::string d = name();
    if (d == "ignore") unsupported(pos, "%ignore (text allowed between any two tokens)");
    if (d != "import") unsupported(pos, "%" + d);
    skip_inline_space();
    std::string mod = name();
    std::vector<std::pair<std::string, size_t>> names;
    if (mod == "common" && peek() == '.') {
      ++i_;
      names.push_back({name(), i_});
    } else if (mod == "common") {
      skip_inline_space();
      if (peek() != '(') syntax(i_, "expected common.NAME or common (NAME, ...)");
      ++i_;
      while (true) {
        skip_space();
        size_t p = i_;
        std::string n = name();
        if (n.empty()) syntax(p, "expected a terminal name");
        names.push_back({n, p});
        skip_space();
        if (peek() == ',') {
          ++i_;
          continue;
        }
        if (peek() != ')') syntax(i_, "expected ',' or ')'");
        ++i_;
        break;
      }
    } else {
      unsupported(pos, "%import from modules other than common");
    }
    skip_inline_space();
    if (peek() == '-' && peek(1) == '>') unsupported(i_, "%import ... -> alias");
    for (auto& [n, p] : names) {
      auto it = lark_common().find(n);
      if (it == lark_common().end()) unsupported(p, "common." + n);
      int r = rule_id(n, p);
      define(r, regex_expr(g_, it->second, RegexTarget::kText, false), p, n);
    }
  }

  int alternates(int depth) {
    std::vector<int> alts = {sequence(depth)};
    while (peek() == '|' && !eof()) {
      ++i_;
      alts.push_back(sequence(depth));
    }
    return g_.choice(std::move(alts));
  }

  int sequence(int depth) {
    std::vector<int> items;
    while (true) {
      skip_space();
      char c = peek();
      if (eof() || c == '|' || c == ')' || (lark() && c == ']') || at_definition()) break;
      if (lark() && c == '-' && peek(1) == '>') {  // an alias names the tree node: no effect on the language
        i_ += 2;
        skip_inline_space();
        if (name().empty()) syntax(i_, "expected a name after '->'");
        continue;
      }
      items.push_back(item(depth));
    }
    return items.empty() ? g_.empty() : g_.seq(std::move(items));
  }

  int count(const char* what_) {
    size_t s = i_;
    long v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = std::min<long>(v * 10 + (peek() - '0'), 1L << 40);
      ++i_;
    }
    if (i_ == s) return -1;
    if (v > opt_.max_repeat) unsupported(s, str("a ", what_, " above ", opt_.max_repeat));
    return int(v);
  }

  int item(int depth) {
    int e = primary(depth);
    for (int ops = 0;; ++ops) {
      skip_inline_space();
      char c = peek();
      size_t pos = i_;
      if (eof()) break;
      // Each operator nests the expression once more; a bound keeps the compiler's recursion shallow.
      if (ops == opt_.max_depth && std::string_view("*+?{~").find(c) != std::string_view::npos)
        unsupported(pos, str("more than ", opt_.max_depth, " repetition operators on one item"));
      if (c == '*' || c == '+' || c == '?') {
        ++i_;
        e = g_.repeat(e, c == '+' ? 1 : 0, c == '?' ? 1 : -1);
      } else if (c == '{' && !lark()) {
        ++i_;
        skip_inline_space();
        int lo = count("repetition count"), hi;
        skip_inline_space();
        if (peek() == ',') {
          ++i_;
          skip_inline_space();
          hi = count("repetition count");
          if (lo < 0) lo = 0;
        } else {
          if (lo < 0) syntax(pos, "expected {m}, {m,}, {m,n} or {,n}");
          hi = lo;
        }
        skip_inline_space();
        if (peek() != '}') syntax(i_, "expected '}' to close the repetition");
        ++i_;
        if (hi >= 0 && hi < lo) syntax(pos, "repetition bounds out of order");
        e = hi == 0 ? g_.empty() : g_.repeat(e, lo, hi);
      } else if (c == '~' && lark()) {
        ++i_;
        skip_inline_space();
        int lo = count("repetition count"), hi = lo;
        if (lo < 0) syntax(i_, "expected a count after '~'");
        if (peek() == '.' && peek(1) == '.') {
          i_ += 2;
          hi = count("repetition count");
          if (hi < 0) syntax(i_, "expected a count after '..'");
        }
        if (hi < lo) syntax(pos, "repetition bounds out of order");
        e = hi == 0 ? g_.empty() : g_.repeat(e, lo, hi);
      } else {
        break;
      }
    }
    return e;
  }

  int primary(int depth) {
    size_t pos = i_;
    char c = peek();
    if (c == '(' || (lark() && c == '[')) {
      if (depth >= opt_.max_depth) unsupported(pos, str("nesting groups deeper than ", opt_.max_depth));
      ++i_;
      int body = alternates(depth + 1);
      char close = c == '(' ? ')' : ']';
      if (peek() != close || eof()) syntax(pos, std::string("unclosed '") + c + "'");
      ++i_;
      return c == '[' ? g_.optional(body) : body;
    }
    if (c == '"' || (lark() && c == '\'')) return string_literal();
    if (c == '[') return char_class();
    if (c == '.' && !lark()) {
      ++i_;
      return utf8_chars(g_, CharSet::all());
    }
    if (c == '/' && lark()) return regex_literal();
    std::string n = name();
    if (!n.empty()) return g_.ref(rule_id(n, pos));
    if (eof()) syntax(pos, "unexpected end of grammar");
    syntax(pos, std::string("unexpected '") + c + "'");
  }

  // One character of a literal or class (escapes decoded).
  uint32_t character(const char* in) {
    size_t pos = i_;
    if (eof()) syntax(pos, std::string("unterminated ") + in);
    if (peek() != '\\') {
      uint32_t cp;
      if (!decode_utf8(t_, i_, cp)) syntax(pos, "invalid UTF-8");
      return cp;
    }
    ++i_;
    if (eof()) syntax(pos, std::string("unterminated ") + in);
    char e = peek();
    ++i_;
    auto hex = [&](int n) {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        char h = peek();
        int dgt = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
        if (dgt < 0 || eof()) syntax(pos, "invalid hex escape");
        v = v * 16 + uint32_t(dgt);
        ++i_;
      }
      if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF))
        syntax(pos, "escape is not a Unicode scalar value");
      return v;
    };
    switch (e) {
      case 'x':
        return hex(2);
      case 'u':
        return hex(4);
      case 'U':
        return hex(8);
      case 't':
        return '\t';
      case 'n':
        return '\n';
      case 'r':
        return '\r';
      case 'f':
        return '\f';
      case 'v':
        return '\v';
      case '0':
        return 0;
      default:
        break;
    }
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '1' && e <= '9') || uint8_t(e) >= 0x80)
      syntax(pos, std::string("unknown escape \\") + e);
    return uint8_t(e);  // \\ \" \' \[ \] \- and other punctuation stand for themselves
  }

  int string_literal() {
    size_t pos = i_;
    char q = peek();
    ++i_;
    std::vector<uint32_t> cps;
    while (true) {
      if (eof() || peek() == '\n') syntax(pos, "unterminated string literal");
      if (peek() == q) {
        ++i_;
        break;
      }
      cps.push_back(character("string literal"));
    }
    if (lark() && peek() == '.' && peek(1) == '.') {  // "a".."z"
      i_ += 2;
      skip_inline_space();
      size_t p2 = i_;
      if (peek() != '"' && peek() != '\'') syntax(p2, "expected a one-character literal after '..'");
      char q2 = peek();
      ++i_;
      uint32_t hi = character("string literal");
      if (peek() != q2) syntax(p2, "a range bound must be one character");
      ++i_;
      if (cps.size() != 1) syntax(pos, "a range bound must be one character");
      if (hi < cps[0]) syntax(pos, "range out of order");
      return utf8_chars(g_, CharSet::range(cps[0], hi));
    }
    bool fold = false;
    if (lark() && peek() == 'i' && !name_char(peek(1), d_)) ++i_, fold = true;
    std::vector<int> parts;
    for (uint32_t c : cps) {
      if (fold && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))) {
        parts.push_back(g_.bytes(ByteSet::of(std::string{char(c | 0x20), char(c & ~0x20)})));
      } else {
        std::string b;
        append_utf8(b, c);
        parts.push_back(g_.literal(b));
      }
    }
    return parts.empty() ? g_.empty() : g_.seq(std::move(parts));
  }

  int char_class() {
    size_t pos = i_;
    ++i_;
    bool negate = peek() == '^' && !eof();
    if (negate) ++i_;
    CharSet s;
    bool any = false;
    while (true) {
      if (eof()) syntax(pos, "unterminated character class");
      if (peek() == ']') {
        ++i_;
        break;
      }
      uint32_t lo = character("character class"), hi = lo;
      if (peek() == '-' && peek(1) != ']' && i_ + 1 < t_.size()) {
        ++i_;
        hi = character("character class");
        if (hi < lo) syntax(pos, "range out of order in character class");
      }
      s.add(lo, hi);
      any = true;
    }
    if (!any) syntax(pos, "empty character class");
    return utf8_chars(g_, negate ? s.complement() : s);
  }

  int regex_literal() {
    size_t pos = i_;
    size_t j = i_ + 1;
    bool in_class = false;
    while (j < t_.size() && (in_class || t_[j] != '/')) {
      if (t_[j] == '\n') syntax(pos, "unterminated /regex/");
      if (t_[j] == '\\')
        ++j;
      else if (t_[j] == '[')
        in_class = true;
      else if (t_[j] == ']')
        in_class = false;
      ++j;
    }
    if (j >= t_.size()) syntax(pos, "unterminated /regex/");
    std::string_view body = t_.substr(i_ + 1, j - i_ - 1);
    i_ = j + 1;
    if (name_char(peek(), d_)) unsupported(i_, "regex flags");
    try {
      return regex_expr(g_, body, RegexTarget::kText, /*search=*/false);
    } catch (const Refused& r) {
      throw Refused(r.keyword(), str(what(), ": ", where(pos), ": ", r.what()));
    } catch (const Error& e) {
      syntax(pos, e.what());
    }
  }

  std::string_view t_;
  Dialect d_;
  const GbnfOptions& opt_;
  size_t i_ = 0;
  Grammar g_;
  std::map<std::string, int> rules_;
  std::map<int, size_t> first_use_, defined_at_;
};

}  // namespace

Grammar from_gbnf(std::string_view text, const GbnfOptions& options) {
  return TextGrammarParser(text, Dialect::kGbnf, options).run();
}

Grammar from_lark(std::string_view text, const GbnfOptions& options) {
  return TextGrammarParser(text, Dialect::kLark, options).run();
}

Grammar from_ebnf(std::string_view text, const GbnfOptions& options) {
  // The first definition operator outside comments and literals decides.
  bool in_comment = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_comment) {
      in_comment = c != '\n';
    } else if (quote) {
      if (c == '\\')
        ++i;
      else if (c == quote)
        quote = 0;
    } else if (c == '#' || (c == '/' && i + 1 < text.size() && text[i + 1] == '/')) {
      in_comment = true;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == ':') {
      return text.substr(i, 3) == "::=" ? from_gbnf(text, options) : from_lark(text, options);
    }
  }
  return from_gbnf(text, options);
}

}  // namespace beluga::grammar
