

#include "grammar/json_schema_compiler.h"
#include "grammar/json_string.h"
#include "grammar/regex.h"
#include "util/error.h"

namespace beluga::grammar::detail {

// Unbounded strings share one rule for their body and closing quote, so its (full-vocabulary) token
// masks are computed once per grammar rather than once per string in the schema.
int SchemaCompiler::string_rest() {
  if (string_rest_ < 0) {
    if (char_ < 0) char_ = json_string_char(g_);
    int r = g_.add_rule("string-rest");
    g_.define(r, g_.seq({g_.repeat(char_, 0, -1), lit("\"")}));
    string_rest_ = g_.ref(r);
  }
  return string_rest_;
}

int SchemaCompiler::string_expr(int min, int max) {
  if (min == 0 && max < 0) return g_.seq({lit("\""), string_rest()});
  if (char_ < 0) char_ = json_string_char(g_);
  return g_.seq({lit("\""), lexeme("string{" + std::to_string(min) + "," + std::to_string(max) + "}",
                                   g_.seq({g_.repeat(char_, min, max), lit("\"")}))});
}

// A call-free piece as a rule of its own: the automaton compiler makes it a DFA, built once however
// often the schema uses it.
int SchemaCompiler::lexeme(const std::string& name, int body) {
  auto it = lexemes_.find(name);
  if (it != lexemes_.end()) return it->second;
  int r = g_.add_rule(name);
  g_.define(r, body);
  return lexemes_[name] = g_.ref(r);
}

int SchemaCompiler::gen_string(const Json& s, const std::string& path) {
  int min = 0, max = -1;
  if (s.contains("minLength")) min = int(std::min<double>(s["minLength"].get<double>(), 1e6));
  if (s.contains("maxLength")) max = int(std::min<double>(s["maxLength"].get<double>(), 1e6));
  if (max >= 0 && max < min) return g_.nothing();
  if (s.contains("pattern")) return gen_pattern(s, path, min, max);
  if (s.contains("format")) {
    BELUGA_CHECK(s["format"].is_string(), "format at ", path, " must be a string");
    std::string f = s["format"].get<std::string>();
    if (min > 0 || max >= 0)
      refuse("format", path, "format together with minLength/maxLength is not supported");
    auto it = lexemes_.find("format:" + f);
    if (it != lexemes_.end()) return g_.seq({lit("\""), it->second});
    int body = format_expr(f);
    if (body < 0) refuse("format", path, "format \"" + f + "\" is not supported");
    return g_.seq({lit("\""), lexeme("format:" + f, g_.seq({body, lit("\"")}))});
  }
  return string_expr(min, max);
}

int SchemaCompiler::format_expr(const std::string& f) {
  auto date = [&] {
    int month = g_.choice({two("01", "09"), two("10", "12")});
    int day = g_.choice({two("01", "09"), two("10", "29"), two("30", "31")});
    return g_.seq({digits(4), lit("-"), month, lit("-"), day});
  };
  auto time = [&] {
    int hour = g_.choice({two("00", "19"), two("20", "23")});
    int minute = two("00", "59");
    int second = g_.choice({two("00", "59"), lit("60")});
    int frac = g_.optional(g_.seq({lit("."), g_.repeat(g_.bytes(ByteSet::range('0', '9')), 1, -1)}));
    int offset = g_.choice(
        {g_.bytes(ByteSet::of("Zz")), g_.seq({g_.bytes(ByteSet::of("+-")), hour, lit(":"), minute})});
    return g_.seq({hour, lit(":"), minute, lit(":"), second, frac, offset});
  };
  if (f == "date") return date();
  if (f == "time") return time();
  if (f == "date-time") return g_.seq({date(), g_.bytes(ByteSet::of("Tt")), time()});
  if (f == "uuid") {
    ByteSet hex = ByteSet::range('0', '9');
    hex.set_range('a', 'f');
    hex.set_range('A', 'F');
    int h = g_.bytes(hex);
    auto hx = [&](int n) { return g_.repeat(h, n, n); };
    return g_.seq({hx(8), lit("-"), hx(4), lit("-"), hx(4), lit("-"), hx(4), lit("-"), hx(12)});
  }
  if (f == "email") {
    ByteSet atext = ByteSet::range('a', 'z');
    atext.set_range('A', 'Z');
    atext.set_range('0', '9');
    for (char c : std::string("!#$%&'*+/=?^_`{|}~-")) atext.set(uint8_t(c));
    int word = g_.repeat(g_.bytes(atext), 1, -1);
    int local = g_.seq({word, g_.repeat(g_.seq({lit("."), word}), 0, -1)});
    ByteSet alnum = ByteSet::range('a', 'z');
    alnum.set_range('A', 'Z');
    alnum.set_range('0', '9');
    ByteSet alnum_dash = alnum;
    alnum_dash.set('-');
    int label = g_.seq(
        {g_.bytes(alnum), g_.optional(g_.seq({g_.repeat(g_.bytes(alnum_dash), 0, 61), g_.bytes(alnum)}))});
    int domain = g_.seq({label, g_.repeat(g_.seq({lit("."), label}), 1, -1)});
    return g_.seq({local, lit("@"), domain});
  }
  return -1;
}

// `pattern` (unanchored, ECMA-262) through the regex front end, over the canonical spelling of the
// string's characters; one rule per distinct pattern, so the automaton compiler makes it a DFA.
int SchemaCompiler::gen_pattern(const Json& s, const std::string& path, int min, int max) {
  BELUGA_CHECK(s["pattern"].is_string(), "pattern at ", path, " must be a string");
  const std::string p = s["pattern"].get<std::string>();
  if (min > 0 || max >= 0)
    refuse("pattern", path, "pattern together with minLength/maxLength is not supported");
  if (s.contains("format")) refuse("pattern", path, "pattern together with format is not supported");
  const std::string name = "pattern:" + p;
  auto it = lexemes_.find(name);
  if (it != lexemes_.end()) return g_.seq({lit("\""), it->second});
  int body;
  try {
    body = regex_expr(g_, p, RegexTarget::kJsonString, /*search=*/true, "pattern");
  } catch (const Refused& r) {
    throw Refused(r.keyword(), std::string(r.what()) + " (at " + path + ")");
  } catch (const Error& e) {
    fail(e.what(), " (at ", path, ")");
  }
  return g_.seq({lit("\""), lexeme(name, g_.seq({body, lit("\"")}))});
}

}  // namespace beluga::grammar::detail
