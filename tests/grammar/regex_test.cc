// The regex front end: accept/reject tables per construct (whole-output match), JSON Schema `pattern`
// (unanchored, over the characters of a JSON string), std::regex (ECMAScript) as an independent oracle
// on random patterns and strings of the supported ASCII subset, Unicode, the refusals and the errors.
#include <gtest/gtest.h>

#include <random>
#include <regex>

#include "grammar/automaton.h"
#include "grammar/compiled.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/refused.h"
#include "grammar/regex.h"

#include "grammar_test_support.h"

namespace beluga::grammar {
namespace {

using testing::automaton_only;
using testing::full;

// The whole text matches pattern p.
bool re(std::string_view p, std::string_view s) {
  return full(automaton_only(from_regex(p)), s);
}

// Some substring matches (regex_expr's search mode over raw text).
bool search(std::string_view p, std::string_view s) {
  Grammar g;
  int r = g.add_rule("root");
  g.root = r;
  g.define(r, regex_expr(g, p, RegexTarget::kText, true));
  return full(automaton_only(g), s);
}

TEST(Regex, EveryConstructAcceptsAndRejects) {
  struct Case {
    const char* pattern;
    std::vector<const char*> yes, no;
  };
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd", "abd"}},
      {"a.c", {"abc", "a c", "a-c"}, {"ac", "a\nc", "a\rc"}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"(ab)+", {"ab", "abab"}, {"", "aba"}},
      {"(?:ab)*c", {"c", "abc", "ababc"}, {"ab", "abac"}},
      {"(?<name>x)y", {"xy"}, {"x", "y"}},
      {"a?b", {"b", "ab"}, {"aab"}},
      {"a{3}", {"aaa"}, {"aa", "aaaa"}},
      {"a{2,}", {"aa", "aaaaa"}, {"a"}},
      {"a{1,3}", {"a", "aaa"}, {"", "aaaa"}},
      {"a{0}b", {"b"}, {"ab"}},
      {"a+?b*?c??", {"a", "aabbc"}, {"b", "acc"}},  // lazy quantifiers: same strings
      {"[abc]", {"a", "c"}, {"d", "ab", ""}},
      {"[a-cx-z]+", {"abz", "y"}, {"d", "w"}},
      {"[^a-c]", {"d", "\n", "\xc3\xa9"}, {"a", "b", ""}},
      {"[-a]", {"-", "a"}, {"b"}},
      {"[a-]", {"-", "a"}, {"b"}},
      {"[\\d.]+", {"1.5", "..", "7"}, {"a"}},
      {"\\d\\D", {"1a", "1-"}, {"12", "a1"}},
      {"\\w\\W", {"a-", "_ ", "Z."}, {"ab", "-a"}},
      {"\\s\\S", {" a", "\ta", "\na", "\xc2\xa0x"}, {"a ", "  "}},
      {"[\\s\\S]", {"\n", "a"}, {""}},
      {"[^]", {"\n"}, {""}},
      {"[]", {}, {"", "a"}},
      {"\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\\\\\/", {".*+?()[]{}|^$\\/"}, {""}},
      {"\\x41\\u0042\\u{43}\\cJ", {"ABC\n"}, {"abc\n"}},
      {"a{,2}", {"a{,2}"}, {"a", "aa"}},  // not a quantifier: literal (Annex B)
      {"x{", {"x{"}, {"x"}},
      {"a]}", {"a]}"}, {}},
      {"^abc$", {"abc"}, {"abcd"}},
      {"^a|b$", {"a", "b"}, {"ab"}},
      {"(a*)*b", {"b", "aab"}, {"a"}},
      {"(a|)+", {"", "aa"}, {"b"}},
  };
  for (const auto& c : cases) {
    auto g = automaton_only(from_regex(c.pattern));
    for (const char* s : c.yes) EXPECT_TRUE(full(g, s)) << "/" << c.pattern << "/ should match '" << s << "'";
    for (const char* s : c.no)
      EXPECT_FALSE(full(g, s)) << "/" << c.pattern << "/ should not match '" << s << "'";
  }
  EXPECT_TRUE(re("\\t\\n\\v\\f\\r\\0", std::string("\t\n\v\f\r\0", 6)));
}

TEST(Regex, CharactersAreCodePoints) {
  EXPECT_TRUE(re("^.$", "\xe6\x97\xa5"));               // 日: one character, three bytes
  EXPECT_FALSE(re("^.$", "\xe6\x97\xa5\xe6\x9c\xac"));  // 日本: two
  EXPECT_TRUE(re("[\xc3\xa9-\xc3\xbc]+", "\xc3\xa9\xc3\xbc"));
  EXPECT_FALSE(re("[\xc3\xa9-\xc3\xbc]+", "e"));
  EXPECT_TRUE(re("[^a]", "\xf0\x9f\x98\x80"));  // 😀
  EXPECT_TRUE(re("\\u{1F600}", "\xf0\x9f\x98\x80"));
  EXPECT_TRUE(re("\\uD83D\\uDE00", "\xf0\x9f\x98\x80"));  // a surrogate pair is one character
  EXPECT_FALSE(re(".", "\xc3"));                          // never broken UTF-8
  EXPECT_FALSE(re("[^a]", "\xed\xa0\x80"));               // nor an encoded surrogate
  EXPECT_TRUE(re("\\s", "\xe3\x80\x80"));                 // U+3000 is ECMAScript white space
}

TEST(Regex, SearchModeIsUnanchoredUnlessAnchored) {
  EXPECT_TRUE(search("b+", "abbc"));
  EXPECT_TRUE(search("", "anything"));
  EXPECT_FALSE(search("^b", "ab"));
  EXPECT_TRUE(search("^a", "ab"));
  EXPECT_FALSE(search("a$", "ab"));
  EXPECT_TRUE(search("b$", "ab"));
  EXPECT_TRUE(search("^x|y$", "xq"));
  EXPECT_TRUE(search("^x|y$", "qy"));
  EXPECT_FALSE(search("^x|y$", "qx"));
}

// JSON Schema `pattern`: the regex applies to the string's characters, whatever their JSON spelling.
TEST(Regex, JsonSchemaPatternConstrainsTheDecodedString) {
  auto schema = [](const char* s) {
    return automaton_only(json_schema_grammar(nlohmann::ordered_json::parse(s)));
  };
  auto g = schema(R"({"type":"string","pattern":"^a\\nb\"$"})");
  EXPECT_TRUE(full(g, R"("a\nb\"")"));
  EXPECT_FALSE(full(g, R"("a\u000ab\"")"));  // not the canonical spelling
  EXPECT_FALSE(full(g, R"("anb\"")"));
  auto h = schema(R"({"pattern":"[0-9]{3}"})");  // strings only: other types are unconstrained
  EXPECT_TRUE(full(h, R"("x123y")"));
  EXPECT_FALSE(full(h, R"("12x3")"));
  EXPECT_TRUE(full(h, "12"));
  EXPECT_TRUE(full(h, "null"));
  auto u = schema(R"({"type":"string","pattern":"^[^\\\\]+$"})");  // no backslash character
  EXPECT_TRUE(full(u, R"("a\"\n")"));                              // escapes spell other characters
  EXPECT_FALSE(full(u, R"("a\\")"));
}

// Random patterns of the supported subset over a small alphabet, against std::regex (ECMAScript).
class RandomPattern {
 public:
  explicit RandomPattern(uint32_t seed) : rng_(seed) {}
  std::string pattern() {
    std::string p = alt(0);
    if (pick(4) == 0) p = "^" + p;
    if (pick(4) == 0) p += "$";
    return p;
  }
  std::string text() {
    static const std::string alphabet = "abc-1 \n.";
    std::string s;
    for (int n = pick(7); n > 0; --n) s += alphabet[pick(int(alphabet.size()))];
    return s;
  }

 private:
  int pick(int n) { return int(rng_() % uint32_t(n)); }
  std::string alt(int depth) {
    std::string s = seq(depth);
    if (depth < 3 && pick(4) == 0) {
      s += '|';
      s += seq(depth);
    }
    return s;
  }
  std::string seq(int depth) {
    std::string s;
    for (int n = 1 + pick(3); n > 0; --n) s += quantified(depth);
    return s;
  }
  std::string quantified(int depth) {
    std::string a = atom(depth);
    static const char* q[] = {"", "", "", "*", "+", "?", "{2}", "{1,}", "{0,2}", "*?", "+?", "{1,2}?"};
    return a + q[pick(12)];
  }
  std::string atom(int depth) {
    static const char* atoms[] = {"a",    "b",     "c",     "-",      "1",      " ",   "\\.",
                                  ".",    "\\d",   "\\D",   "\\w",    "\\W",    "\\s", "\\S",
                                  "[ab]", "[^ab]", "[a-c]", "[\\d-]", "[^\\s]", "\\n", "[.]"};
    int n = sizeof atoms / sizeof *atoms;
    if (depth < 3 && pick(5) == 0) {
      std::string g = pick(2) ? "(" : "(?:";
      g += alt(depth + 1);
      g += ')';
      return g;
    }
    return atoms[pick(n)];
  }
  std::mt19937 rng_;
};

TEST(Regex, AgreesWithStdRegexOnRandomPatterns) {
  RandomPattern gen(7);
  int checked = 0, matched = 0;
  for (int i = 0; i < 200; ++i) {
    std::string p = gen.pattern();
    std::regex oracle(p, std::regex::ECMAScript);
    auto whole = automaton_only(from_regex(p));
    Grammar g;
    int r = g.add_rule("root");
    g.root = r;
    g.define(r, regex_expr(g, p, RegexTarget::kText, true));
    auto searching = automaton_only(g);
    auto schema =
        automaton_only(json_schema_grammar(nlohmann::ordered_json{{"type", "string"}, {"pattern", p}}));
    for (int k = 0; k < 12; ++k) {
      std::string s = gen.text();
      bool m = std::regex_match(s, oracle);
      ASSERT_EQ(full(whole, s), m) << "/" << p << "/ full match of '" << s << "'";
      bool f = std::regex_search(s, oracle);
      ASSERT_EQ(full(searching, s), f) << "/" << p << "/ search in '" << s << "'";
      ASSERT_EQ(full(schema, nlohmann::json(s).dump()), f)
          << "pattern /" << p << "/ on " << nlohmann::json(s).dump();
      ++checked;
      matched += m;
    }
  }
  EXPECT_GT(matched, checked / 20) << "the random strings should match often enough to test something";
}

TEST(Regex, RefusesWhatAGrammarCannotEnforce) {
  auto refusal = [](const char* p) -> std::string {
    try {
      from_regex(p);
    } catch (const Refused& r) {
      return r.what();
    }
    return "";
  };
  EXPECT_NE(refusal("(a)\\1").find("backreferences"), std::string::npos);
  EXPECT_NE(refusal("(?<n>a)\\k<n>").find("named backreferences"), std::string::npos);
  EXPECT_NE(refusal("a(?=b)").find("lookahead"), std::string::npos);
  EXPECT_NE(refusal("a(?!b)").find("lookahead"), std::string::npos);
  EXPECT_NE(refusal("(?<=a)b").find("lookbehind"), std::string::npos);
  EXPECT_NE(refusal("(?<!a)b").find("lookbehind"), std::string::npos);
  EXPECT_NE(refusal("\\bword\\b").find("word boundary"), std::string::npos);
  EXPECT_NE(refusal("\\p{L}").find("property escapes"), std::string::npos);
  EXPECT_NE(refusal("(?i)a").find("inline flags"), std::string::npos);
  EXPECT_NE(refusal("a^b").find("^ and $"), std::string::npos);
  EXPECT_NE(refusal("a{1000001}").find("repetition count"), std::string::npos);
  EXPECT_NE(refusal("((a{1000}){1000})").find("too large"), std::string::npos);
  EXPECT_NE(refusal(std::string(200, '(').c_str()).find("nest deeper"), std::string::npos);
  EXPECT_NE(refusal("(a)\\1").find("column 4"), std::string::npos);
}

TEST(Regex, MalformedPatternsNameTheProblemAndColumn) {
  auto error = [](const char* p) -> std::string {
    try {
      from_regex(p);
    } catch (const Refused& r) {
      return std::string("refused: ") + r.what();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error("(ab").find("unterminated group"), std::string::npos);
  EXPECT_NE(error("ab)").find("unmatched ')' at column 3"), std::string::npos);
  EXPECT_NE(error("[ab").find("unterminated character class"), std::string::npos);
  EXPECT_NE(error("*a").find("nothing to repeat at column 1"), std::string::npos);
  EXPECT_NE(error("a**").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(error("^*").find("nothing to repeat"), std::string::npos);
  EXPECT_NE(error("a{2,1}").find("out of order"), std::string::npos);
  EXPECT_NE(error("[z-a]").find("out of order"), std::string::npos);
  EXPECT_NE(error("[\\d-z]").find("cannot bound a range"), std::string::npos);
  EXPECT_NE(error("\\q").find("unknown escape \\q"), std::string::npos);
  EXPECT_NE(error("\\x4").find("invalid \\x escape"), std::string::npos);
  EXPECT_NE(error("\\uD800").find("lone surrogate"), std::string::npos);
  EXPECT_NE(error("a\\").find("at end of pattern"), std::string::npos);
  EXPECT_NE(error("\xff").find("invalid UTF-8"), std::string::npos);
}

// The mask (adaptive cache, full vocabulary) agrees with feeding every token, for a regex grammar.
TEST(Regex, MaskMatchesTokenByTokenFeeding) {
  std::vector<std::string> v = {"<s>", "</s>"};
  for (const char* s :
       {"a", "b", "-", "1", "12", "ab", "b-", "-1", "a-", "2", "x", "\xc3", "\xa9", "\xc3\xa9", "aa"})
    v.push_back(s);
  auto vocab = std::make_shared<TokenVocab>(v, std::vector<int>{0, 1}, std::vector<int>{1});
  auto g = compile(from_regex("(a|b)+-[0-9]{1,3}(\xc3\xa9)?"), vocab);
  std::vector<uint32_t> mask(vocab->mask_words());
  for (std::string out : {"ab-12\xc3\xa9", "a-1", "bbab-121"}) {
    Matcher m(g);
    for (size_t i = 0;; ++i) {
      m.fill_mask(mask.data());
      for (size_t t = 0; t < vocab->size(); ++t)
        ASSERT_EQ(bool((mask[t >> 5] >> (t & 31)) & 1), m.allows(int(t))) << "token " << t << " at " << i;
      if (i == out.size()) break;
      ASSERT_TRUE(m.accept_bytes(out.substr(i, 1)));
    }
    EXPECT_TRUE(m.is_accepting());
    EXPECT_TRUE(m.allows(1));  // EOS at the end
  }
}

}  // namespace
}  // namespace beluga::grammar
