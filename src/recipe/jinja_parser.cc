#include "recipe/jinja_parser.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "util/error.h"

namespace beluga::recipe::jinja {

namespace {

// ---- preprocessing: the whitespace rules of transformers' Jinja environment ----

bool is_tag_open(std::string_view s, size_t i) {
  return i + 1 < s.size() && s[i] == '{' && (s[i + 1] == '#' || s[i + 1] == '%' || s[i + 1] == '-');
}

std::string preprocess(std::string_view src) {
  if (!src.empty() && src.back() == '\n') src.remove_suffix(1);
  // lstrip_blocks: spaces and tabs from the start of a line up to a block or comment tag.
  std::string a;
  a.reserve(src.size());
  size_t i = 0;
  while (i < src.size()) {
    size_t line_end = src.find('\n', i);
    if (line_end == std::string_view::npos) line_end = src.size();
    size_t j = i;
    while (j < line_end && (src[j] == ' ' || src[j] == '\t')) ++j;
    a.append(src.substr(is_tag_open(src, j) ? j : i, line_end - (is_tag_open(src, j) ? j : i)));
    if (line_end < src.size()) a += '\n';
    i = line_end + 1;
  }
  // trim_blocks: the first newline after a block or comment tag (and after `-}}`).
  std::string b;
  b.reserve(a.size());
  for (size_t k = 0; k < a.size(); ++k) {
    b += a[k];
    if (a[k] == '}' && k > 0 && (a[k - 1] == '#' || a[k - 1] == '%' || a[k - 1] == '-') && k + 1 < a.size() &&
        a[k + 1] == '\n')
      ++k;
  }
  return b;
}

// ---- lexer ----

struct Token {
  enum class Kind { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kNumber, kOp, kEof };
  Kind kind;
  std::string text;
  Value number;
  int line;
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::vector<Token> lex(const std::string& s) {
  std::vector<Token> out;
  size_t i = 0;
  int line = 1;
  bool strip_next = false;  // a `-` closed the previous tag: trim the next text's leading space
  auto advance_lines = [&](size_t from, size_t to) {
    for (size_t k = from; k < to; ++k)
      if (s[k] == '\n') ++line;
  };
  while (i < s.size()) {
    size_t open = i;
    while (true) {
      open = s.find('{', open);
      if (open == std::string::npos ||
          (open + 1 < s.size() && (s[open + 1] == '{' || s[open + 1] == '%' || s[open + 1] == '#')))
        break;
      ++open;
    }
    if (open == std::string::npos) open = s.size();
    std::string text = s.substr(i, open - i);
    int text_line = line;
    advance_lines(i, open);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    }
    strip_next = false;
    bool strip_before = open + 2 < s.size() && s[open + 2] == '-';
    if (strip_before) {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    }
    if (!text.empty()) out.push_back({Token::Kind::kText, std::move(text), {}, text_line});
    if (open >= s.size()) break;
    char kind = s[open + 1];
    i = open + 2 + (strip_before ? 1 : 0);
    if (kind == '#') {
      size_t close = s.find("#}", i);
      BELUGA_CHECK(close != std::string::npos, "template line ", line, ": unclosed comment");
      strip_next = close > i && s[close - 1] == '-';
      advance_lines(i, close);
      i = close + 2;
      continue;
    }
    const bool var = kind == '{';
    out.push_back({var ? Token::Kind::kVarBegin : Token::Kind::kBlockBegin, "", {}, line});
    int depth = 0;  // brackets open inside the tag, so `}}` of a dict literal does not end it
    while (true) {
      while (i < s.size() && is_space(s[i])) {
        if (s[i] == '\n') ++line;
        ++i;
      }
      BELUGA_CHECK(i < s.size(), "template line ", line, ": unclosed tag");
      const char end1 = var ? '}' : '%';
      if (depth == 0) {
        if (s[i] == '-' && i + 2 < s.size() && s[i + 1] == end1 && s[i + 2] == '}') {
          strip_next = true;
          i += 3;
          break;
        }
        if (s[i] == end1 && i + 1 < s.size() && s[i + 1] == '}') {
          i += 2;
          break;
        }
      }
      char c = s[i];
      if (c == '\'' || c == '"') {
        std::string str;
        size_t k = i + 1;
        while (k < s.size() && s[k] != c) {
          if (s[k] == '\\' && k + 1 < s.size()) {
            char e = s[++k];
            switch (e) {
              case 'n':
                str += '\n';
                break;
              case 't':
                str += '\t';
                break;
              case 'r':
                str += '\r';
                break;
              case 'b':
                str += '\b';
                break;
              case 'f':
                str += '\f';
                break;
              case 'v':
                str += '\v';
                break;
              case '0':
                str += '\0';
                break;
              default:
                str += e;  // \\ \' \" and unknown escapes keep the character
            }
            ++k;
            continue;
          }
          if (s[k] == '\n') ++line;
          str += s[k++];
        }
        BELUGA_CHECK(k < s.size(), "template line ", line, ": unterminated string");
        out.push_back({Token::Kind::kString, std::move(str), {}, line});
        i = k + 1;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t k = i;
        while (k < s.size() && (std::isdigit(static_cast<unsigned char>(s[k])) || s[k] == '_')) ++k;
        bool is_float = false;
        if (k + 1 < s.size() && s[k] == '.' && std::isdigit(static_cast<unsigned char>(s[k + 1]))) {
          is_float = true;
          ++k;
          while (k < s.size() && std::isdigit(static_cast<unsigned char>(s[k]))) ++k;
        }
        std::string num;
        for (size_t q = i; q < k; ++q)
          if (s[q] != '_') num += s[q];
        Value v = is_float ? Value::real(std::strtod(num.c_str(), nullptr))
                           : Value::integer(std::strtoll(num.c_str(), nullptr, 10));
        out.push_back({Token::Kind::kNumber, num, v, line});
        i = k;
      } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t k = i;
        while (k < s.size() && (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '_')) ++k;
        out.push_back({Token::Kind::kName, s.substr(i, k - i), {}, line});
        i = k;
      } else {
        static const char* two[] = {"**", "//", "==", "!=", "<=", ">="};
        std::string op(1, c);
        for (const char* t : two)
          if (s.compare(i, 2, t) == 0) op = t;
        BELUGA_CHECK(op.size() == 2 || std::string("+-*/%~|.,:()[]{}<>=").find(c) != std::string::npos,
                     "template line ", line, ": unexpected character '", c, "'");
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        out.push_back({Token::Kind::kOp, op, {}, line});
        i += op.size();
      }
    }
    out.push_back({var ? Token::Kind::kVarEnd : Token::Kind::kBlockEnd, "", {}, line});
  }
  out.push_back({Token::Kind::kEof, "", {}, line});
  return out;
}

// ---- parser ----

using K = Token::Kind;

class Parser {
 public:
  explicit Parser(std::vector<Token> t) : t_(std::move(t)) {}

  Body parse_all() {
    std::string end;
    Body b = parse_body({}, end);
    BELUGA_CHECK(end.empty(), "template line ", peek().line, ": unexpected {% ", end, " %}");
    return b;
  }

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(pos_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(pos_++, t_.size() - 1)]; }
  bool at_op(const char* op) const { return peek().kind == K::kOp && peek().text == op; }
  bool at_name(const char* n) const { return peek().kind == K::kName && peek().text == n; }
  [[noreturn]] void error(const std::string& what) const {
    fail("template line ", peek().line, ": ", what, peek().text.empty() ? "" : " near '" + peek().text + "'");
  }
  // Counts the parser's own recursion (parentheses, `not not`, nested blocks), which builds no
  // tree depth of its own.
  struct Nest {
    Parser& p;
    explicit Nest(Parser& parser) : p(parser) {
      if (++p.nest_ > kMaxTemplateNesting) p.too_deep();
    }
    ~Nest() { --p.nest_; }
  };
  [[noreturn]] void too_deep() const {
    fail("template line ", peek().line, ": nested deeper than ", kMaxTemplateNesting, " levels");
  }
  // A node's height from its children's; refused past the limit (operator chains such as
  // `1+1+...+1` are parsed by loops, not recursion, but evaluated recursively).
  ExprPtr sized(std::shared_ptr<Expr> e) {
    int d = 0;
    for (const auto& a : e->args)
      if (a) d = std::max(d, a->depth);
    for (const auto& [k, a] : e->kwargs)
      if (a) d = std::max(d, a->depth);
    e->depth = d + 1;
    if (e->depth > kMaxTemplateNesting) too_deep();
    return e;
  }
  void expect_op(const char* op) {
    if (!at_op(op)) error(std::string("expected '") + op + "'");
    ++pos_;
  }
  std::string expect_name() {
    if (peek().kind != K::kName) error("expected a name");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != K::kBlockEnd) error("expected %}");
    ++pos_;
  }

  // Parses nodes until a block tag named in `ends`; returns its name in `end` (tag consumed up to
  // its name; the caller reads the rest of the tag).
  Body parse_body(const std::set<std::string>& ends, std::string& end) {
    Body body;
    end.clear();
    while (peek().kind != K::kEof) {
      const Token& tok = peek();
      if (tok.kind == K::kText) {
        Node n;
        n.kind = Node::Kind::kText;
        n.line = tok.line;
        n.text = tok.text;
        body.push_back(std::move(n));
        ++pos_;
      } else if (tok.kind == K::kVarBegin) {
        ++pos_;
        Node n;
        n.kind = Node::Kind::kOutput;
        n.line = tok.line;
        n.expr = parse_expr();
        if (peek().kind != K::kVarEnd) error("expected }}");
        ++pos_;
        body.push_back(std::move(n));
      } else if (tok.kind == K::kBlockBegin) {
        const Token& name = peek(1);
        if (name.kind == K::kName && ends.count(name.text)) {
          pos_ += 2;
          end = name.text;
          return body;
        }
        ++pos_;
        body.push_back(parse_statement());
      } else {
        error("unexpected token");
      }
    }
    if (!ends.empty()) fail("template: missing {% ", *ends.rbegin(), " %} at end of template");
    return body;
  }

  Node parse_statement() {
    const Nest nest(*this);
    int line = peek().line;
    std::string kw = expect_name();
    Node n;
    n.line = line;
    std::string end;
    if (kw == "if") {
      n.kind = Node::Kind::kIf;
      ExprPtr cond = parse_expr();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"}, end);
        n.branches.emplace_back(cond, std::move(b));
        if (end == "elif") {
          cond = parse_expr();
          expect_block_end();
          continue;
        }
        if (end == "else") {
          expect_block_end();
          n.else_body = parse_body({"endif"}, end);
        }
        expect_block_end();
        break;
      }
    } else if (kw == "for") {
      n.kind = Node::Kind::kFor;
      n.targets.push_back(expect_name());
      while (at_op(",")) {
        ++pos_;
        n.targets.push_back(expect_name());
      }
      if (!at_name("in")) error("expected 'in'");
      ++pos_;
      n.expr = parse_or();  // no conditional expression: `if` here filters the loop
      if (at_name("if")) {
        ++pos_;
        n.filter = parse_expr();
      }
      if (at_name("recursive")) error("recursive loops are not supported");
      expect_block_end();
      n.body = parse_body({"else", "endfor"}, end);
      if (end == "else") {
        expect_block_end();
        n.else_body = parse_body({"endfor"}, end);
      }
      expect_block_end();
    } else if (kw == "set") {
      n.kind = Node::Kind::kSet;
      std::string target = expect_name();
      if (at_op(".")) {
        ++pos_;
        target += "." + expect_name();
      }
      n.targets.push_back(target);
      while (at_op(",")) {
        ++pos_;
        n.targets.push_back(expect_name());
      }
      if (at_op("=")) {
        ++pos_;
        n.expr = parse_tuple_expr();
        expect_block_end();
      } else {
        expect_block_end();
        n.body = parse_body({"endset"}, end);
        expect_block_end();
      }
    } else if (kw == "macro") {
      n.kind = Node::Kind::kMacro;
      n.text = expect_name();
      expect_op("(");
      while (!at_op(")")) {
        std::string p = expect_name();
        ExprPtr def;
        if (at_op("=")) {
          ++pos_;
          def = parse_expr();
        }
        n.params.emplace_back(p, def);
        if (at_op(",")) ++pos_;
      }
      expect_op(")");
      expect_block_end();
      n.body = parse_body({"endmacro"}, end);
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      n.kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
    } else {
      fail("template line ", line, ": unsupported tag {% ", kw, " %}");
    }
    return n;
  }

  ExprPtr make(Expr::Kind kind, std::vector<ExprPtr> args, std::string name = "") {
    auto e = std::make_shared<Expr>();
    e->kind = kind;
    e->args = std::move(args);
    e->name = std::move(name);
    e->line = peek().line;
    return sized(std::move(e));
  }

  // `a, b` without brackets is a tuple (only where Jinja allows it: set values).
  ExprPtr parse_tuple_expr() {
    ExprPtr first = parse_expr();
    if (!at_op(",")) return first;
    std::vector<ExprPtr> items{first};
    while (at_op(",")) {
      ++pos_;
      items.push_back(parse_expr());
    }
    return make(Expr::Kind::kList, std::move(items));
  }

  ExprPtr parse_expr() {
    const Nest nest(*this);
    ExprPtr e = parse_or();
    if (at_name("if")) {
      ++pos_;
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (at_name("else")) {
        ++pos_;
        other = parse_expr();
      }
      return make(Expr::Kind::kCondExpr, {cond, e, other});
    }
    return e;
  }
  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (at_name("or")) {
      ++pos_;
      e = make(Expr::Kind::kBinary, {e, parse_and()}, "or");
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (at_name("and")) {
      ++pos_;
      e = make(Expr::Kind::kBinary, {e, parse_not()}, "and");
    }
    return e;
  }
  ExprPtr parse_not() {
    const Nest nest(*this);
    if (at_name("not")) {
      ++pos_;
      return make(Expr::Kind::kUnary, {parse_not()}, "not");
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      std::string op;
      if (peek().kind == K::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                    peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (at_name("in")) {
        ++pos_;
        op = "in";
      } else if (at_name("not") && peek(1).kind == K::kName && peek(1).text == "in") {
        pos_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = make(Expr::Kind::kBinary, {e, parse_math1()}, op);
    }
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (at_op("+") || at_op("-")) {
      std::string op = next().text;
      e = make(Expr::Kind::kBinary, {e, parse_concat()}, op);
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (at_op("~")) {
      ++pos_;
      e = make(Expr::Kind::kBinary, {e, parse_math2()}, "~");
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      std::string op = next().text;
      e = make(Expr::Kind::kBinary, {e, parse_pow()}, op);
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary();
    while (at_op("**")) {
      ++pos_;
      e = make(Expr::Kind::kBinary, {e, parse_unary()}, "**");
    }
    return e;
  }
  ExprPtr parse_unary() {
    if (at_op("-") || at_op("+")) {
      std::string op = next().text;
      return parse_filters(make(Expr::Kind::kUnary, {parse_unary_nofilter()}, op));
    }
    return parse_filters(parse_postfix(parse_primary()));
  }
  ExprPtr parse_unary_nofilter() {
    const Nest nest(*this);
    if (at_op("-") || at_op("+")) {
      std::string op = next().text;
      return make(Expr::Kind::kUnary, {parse_unary_nofilter()}, op);
    }
    return parse_postfix(parse_primary());
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    while (!at_op(")")) {
      if (peek().kind == K::kName && peek(1).kind == K::kOp && peek(1).text == "=") {
        std::string k = next().text;
        ++pos_;
        call.kwargs.emplace_back(k, parse_expr());
      } else {
        call.args.push_back(parse_expr());
      }
      if (!at_op(")")) expect_op(",");
    }
    expect_op(")");
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (at_op("|")) {
        ++pos_;
        auto f = std::make_shared<Expr>();
        f->kind = Expr::Kind::kFilter;
        f->line = peek().line;
        f->name = expect_name();
        f->args.push_back(e);
        if (at_op("(")) parse_call_args(*f);
        e = parse_postfix(sized(std::move(f)));
      } else if (at_name("is")) {
        ++pos_;
        auto t = std::make_shared<Expr>();
        t->kind = Expr::Kind::kTest;
        t->line = peek().line;
        if (at_name("not")) {
          ++pos_;
          t->negate = true;
        }
        t->name = expect_name();
        t->args.push_back(e);
        if (at_op("(")) {
          parse_call_args(*t);
        } else if (peek().kind == K::kNumber || peek().kind == K::kString ||
                   (peek().kind == K::kName && !at_name("and") && !at_name("or") && !at_name("else") &&
                    !at_name("if") && !at_name("is") && !at_name("in") && !at_name("not"))) {
          t->args.push_back(parse_primary());  // `is sameas false`, `is divisibleby 3`
        }
        e = sized(std::move(t));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (at_op(".")) {
        ++pos_;
        if (peek().kind == K::kNumber && peek().number.type == Value::Type::kInt) {
          auto idx = std::make_shared<Expr>();
          idx->value = next().number;
          e = make(Expr::Kind::kItem, {e, idx});
        } else {
          e = make(Expr::Kind::kAttr, {e}, expect_name());
        }
      } else if (at_op("[")) {
        ++pos_;
        ExprPtr parts[3];
        int n = 0;
        bool slice = false;
        while (true) {
          if (!at_op(":") && !at_op("]")) parts[n] = parse_expr();
          if (at_op(":")) {
            slice = true;
            ++pos_;
            if (++n > 2) error("bad slice");
            continue;
          }
          break;
        }
        expect_op("]");
        if (!slice && !parts[0]) error("empty subscript");  // `x[]`: Jinja's parser refuses it too
        e = slice ? make(Expr::Kind::kSlice, {e, parts[0], parts[1], parts[2]})
                  : make(Expr::Kind::kItem, {e, parts[0]});
      } else if (at_op("(")) {
        auto c = std::make_shared<Expr>();
        c->kind = Expr::Kind::kCall;
        c->line = peek().line;
        c->args.push_back(e);
        parse_call_args(*c);
        e = sized(std::move(c));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_primary() {
    const Token& tok = peek();
    auto lit = [&](Value v) {
      auto e = std::make_shared<Expr>();
      e->value = std::move(v);
      e->line = tok.line;
      return e;
    };
    if (tok.kind == K::kString) {
      std::string s = next().text;
      while (peek().kind == K::kString) s += next().text;  // adjacent literals concatenate
      return lit(Value::string(s));
    }
    if (tok.kind == K::kNumber) return lit(next().number);
    if (tok.kind == K::kName) {
      std::string n = next().text;
      if (n == "true" || n == "True") return lit(Value::boolean(true));
      if (n == "false" || n == "False") return lit(Value::boolean(false));
      if (n == "none" || n == "None") return lit(Value::none());
      return make(Expr::Kind::kName, {}, n);
    }
    if (at_op("(")) {
      ++pos_;
      if (at_op(")")) {
        ++pos_;
        return make(Expr::Kind::kList, {});
      }
      ExprPtr e = parse_expr();
      if (at_op(",")) {
        std::vector<ExprPtr> items{e};
        while (at_op(",")) {
          ++pos_;
          if (at_op(")")) break;
          items.push_back(parse_expr());
        }
        e = make(Expr::Kind::kList, std::move(items));
      }
      expect_op(")");
      return e;
    }
    if (at_op("[")) {
      ++pos_;
      std::vector<ExprPtr> items;
      while (!at_op("]")) {
        items.push_back(parse_expr());
        if (!at_op("]")) expect_op(",");
      }
      ++pos_;
      return make(Expr::Kind::kList, std::move(items));
    }
    if (at_op("{")) {
      ++pos_;
      std::vector<ExprPtr> kv;
      while (!at_op("}")) {
        kv.push_back(parse_expr());
        expect_op(":");
        kv.push_back(parse_expr());
        if (!at_op("}")) expect_op(",");
      }
      ++pos_;
      return make(Expr::Kind::kDict, std::move(kv));
    }
    error("unexpected token in expression");
  }

  std::vector<Token> t_;
  size_t pos_ = 0;
  int nest_ = 0;
};

}  // namespace

Body parse_template(std::string_view source) {
  return Parser(lex(preprocess(source))).parse_all();
}

}  // namespace beluga::recipe::jinja
