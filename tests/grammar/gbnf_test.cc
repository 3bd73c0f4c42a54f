// The GBNF and Lark front ends: every construct of the format, a JSON grammar checked against a JSON
// parser (nlohmann::json::accept) on random valid and mutated texts, arithmetic and list grammars,
// masks agreeing with token-by-token feeding, and errors with line and column.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "grammar/automaton.h"
#include "grammar/compiled.h"
#include "grammar/gbnf.h"
#include "grammar/matcher.h"
#include "grammar/refused.h"

#include "grammar_test_support.h"

namespace beluga::grammar {
namespace {

using testing::automaton_only;
using testing::full;

struct Case {
  const char* grammar;
  std::vector<std::string> yes, no;
};

void expect_cases(const std::vector<Case>& cases, Grammar (*front)(std::string_view, const GbnfOptions&)) {
  for (const auto& c : cases) {
    auto g = automaton_only(front(c.grammar, {}));
    for (const auto& s : c.yes) EXPECT_TRUE(full(g, s)) << c.grammar << "\nshould accept '" << s << "'";
    for (const auto& s : c.no) EXPECT_FALSE(full(g, s)) << c.grammar << "\nshould reject '" << s << "'";
  }
}

TEST(Gbnf, EveryConstructAcceptsAndRejects) {
  expect_cases(
      {
          {R"(root ::= "ab" "c")", {"abc"}, {"ab", "abcd"}},
          {R"(root ::= "a" | "b" | )", {"a", "b", ""}, {"ab"}},
          {R"(root ::= ("a" | "b")+ "c"?)", {"a", "abba", "abc"}, {"", "c", "acc"}},
          {R"(root ::= "x"*)", {"", "xxx"}, {"y"}},
          {R"(root ::= "a"{2} "b"{1,} "c"{0,2} "d"{,1})", {"aab", "aabbbccd"}, {"ab", "aabccc", "aabdd"}},
          {R"(root ::= [a-c] [^a-c] [xyz-])", {"adx", "b\n-"}, {"aax", "adw"}},
          {R"(root ::= [^"\\\x7F\x00-\x1F]+)", {"abc", "\xc3\xa9"}, {"a\"", "\\", "\x7f", "\x01"}},
          {R"(root ::= "\x41\u00e9\U0001F600\t\n\r\\\"\[\]")",
           {"A\xc3\xa9\xf0\x9f\x98\x80\t\n\r\\\"[]"},
           {"A"}},
          {R"(root ::= . .)", {"ab", "\xe6\x97\xa5\n"}, {"a", "abc", "\xe6\x97"}},
          {"# a comment\nroot ::= item-list # trailing comment\nitem-list ::= item (\",\" item)*\nitem ::= "
           "[0-9]+\n",
           {"1", "12,3"},
           {"", "1,", ",1"}},
          {"root ::=\n  \"a\"\n  | \"b\"\n  ( \"c\"\n    \"d\" )\n", {"a", "bcd"}, {"b", "cd"}},
          {R"(root ::= [\]\[-] "\u0041")", {"]A", "[A", "-A"}, {"A"}},
      },
      from_gbnf);
}

TEST(Gbnf, ArithmeticAndLists) {
  expect_cases({{R"g(root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")" | "-" factor
number ::= [0-9]+ ("." [0-9]+)?)g",
                 {"1", "1+2*(3-4)", "-(2.5/3)*-1", "((1))"},
                 {"", "1+", "(1", "1++2", "1.", "()", "1 + 2"}},
                {R"(root ::= "[" ws (item (ws "," ws item)*)? ws "]"
item ::= [a-z]{1,3} | root
ws ::= " "{0,2})",
                 {"[]", "[a,bc]", "[ abc , [x], [] ]", "[[[]]]"},
                 {"[abcd]", "[a,]", "[,a]", "[a   ,b]", "[a"}}},
               from_gbnf);
}

// A strict JSON grammar in GBNF (RFC 8259, no whitespace), against a JSON parser.
const char* kJsonGbnf = R"(# JSON values, compact
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ( member ( "," member )* )? "}"
member ::= string ":" value
array  ::= "[" ( value ( "," value )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} ) )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
)";

TEST(Gbnf, JsonGrammarAgreesWithAJsonParser) {
  auto g = automaton_only(from_gbnf(kJsonGbnf));
  std::mt19937 rng(3);
  auto pick = [&](int n) { return int(rng() % uint32_t(n)); };
  std::function<nlohmann::json(int)> value = [&](int depth) -> nlohmann::json {
    switch (depth > 3 ? pick(4) : pick(6)) {
      case 0:
        return nullptr;
      case 1:
        return pick(2) == 0;
      case 2:
        return pick(3) ? nlohmann::json(pick(2000) - 1000) : nlohmann::json(pick(1000) / 7.0);
      case 3:
        return std::vector<std::string>{"", "s", "\"", "\\", "\n", "\xc3\xa9", "a\x01b"}[size_t(pick(7))];
      case 4: {
        nlohmann::json a = nlohmann::json::array();
        for (int n = pick(4); n > 0; --n) a.push_back(value(depth + 1));
        return a;
      }
      default: {
        nlohmann::json o = nlohmann::json::object();
        for (int n = pick(4); n > 0; --n) o[std::string(1, char('a' + pick(3)))] = value(depth + 1);
        return o;
      }
    }
  };
  // No e/E (the parser rejects huge exponents) and no whitespace (the grammar is compact).
  const std::string noise = "{}[],:\"\\0123456789.+-tfnulax";
  int valid = 0, invalid = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string s = value(0).dump();
    if (pick(2)) {  // mutate: insert, delete or replace one byte
      size_t at = size_t(pick(int(s.size()) + 1));
      char c = noise[size_t(pick(int(noise.size())))];
      switch (pick(3)) {
        case 0:
          s.insert(at, 1, c);
          break;
        case 1:
          if (at < s.size()) s.erase(at, 1);
          break;
        default:
          if (at < s.size()) s[at] = c;
      }
    }
    bool ok = nlohmann::json::accept(s);
    ASSERT_EQ(full(g, s), ok) << s;
    (ok ? valid : invalid)++;
  }
  EXPECT_GT(valid, 500);
  EXPECT_GT(invalid, 500);
}

TEST(Gbnf, LarkSubset) {
  expect_cases(
      {
          {"start: greeting NAME\ngreeting: \"hi \" | 'hello '\nNAME: /[A-Z][a-z]*/\n",
           {"hi Bob", "hello X"},
           {"hi bob", "hey Bob"}},
          {"?start: \"sel\"i \"a\"..\"c\"~2..3 [\"!\"] -> alias\n",
           {"SELab", "sElabc!"},
           {"sel a", "selabcd"}},
          {"start: INT (\",\" WS? SIGNED_NUMBER)*\n%import common.INT\n%import common (WS, SIGNED_NUMBER)\n",
           {"1", "12, -3.5e2,4"},
           {"-1", "1,"}},
          {"start: x ~ 2\nx.2: ESCAPED_STRING\n%import common.ESCAPED_STRING // a comment\n",
           {R"("a""b\"")"},
           {R"("a")", R"("a\")"}},
      },
      from_lark);
  EXPECT_TRUE(full(automaton_only(from_ebnf("start: \"x\"")), "x"));  // told apart from GBNF
  EXPECT_TRUE(full(automaton_only(from_ebnf("# a: comment\nroot ::= \"y\"")), "y"));
}

std::string error_of(std::string_view text,
                     Grammar (*front)(std::string_view, const GbnfOptions&) = from_gbnf) {
  try {
    compile_automaton(front(text, {}));
  } catch (const Refused& r) {
    return std::string("refused ") + r.keyword() + ": " + r.what();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Gbnf, ErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("root ::= item\nitem ::= \"a\" other\n"),
            "gbnf: line 2, column 14: undefined rule 'other'");
  EXPECT_EQ(error_of("item ::= \"a\"\n"), "gbnf: no 'root' rule (the whole output matches it)");
  EXPECT_EQ(error_of("root ::= \"abc\n"), "gbnf: line 1, column 10: unterminated string literal");
  EXPECT_EQ(error_of("root = \"a\"\n"), "gbnf: line 1, column 6: expected '::=' after the rule name");
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\"\n"),
            "gbnf: line 2, column 1: rule 'root' is defined twice (first at line 1, column 1)");
  EXPECT_EQ(error_of("root ::= (\"a\" \n"), "gbnf: line 1, column 10: unclosed '('");
  EXPECT_EQ(error_of("root ::= [b-a]\n"), "gbnf: line 1, column 10: range out of order in character class");
  EXPECT_EQ(error_of("root ::= []\n"), "gbnf: line 1, column 10: empty character class");
  EXPECT_EQ(error_of("root ::= \"\\q\"\n"), "gbnf: line 1, column 11: unknown escape \\q");
  EXPECT_EQ(error_of("root ::= \"a\"{3,1}\n"), "gbnf: line 1, column 13: repetition bounds out of order");
  EXPECT_EQ(error_of("root ::= \"a\" )\n"), "gbnf: line 1, column 14: unexpected ')'");
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"\n").find("refused left-recursion"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{200000}\n").find("refused gbnf"), std::string::npos);
  EXPECT_NE(error_of("root ::= " + std::string(300, '(') + "\n").find("nesting groups"), std::string::npos);
  EXPECT_NE(error_of("start: \"a\"\n%ignore \" \"\n", from_lark).find("refused lark"), std::string::npos);
  EXPECT_NE(error_of("start: /a(?=b)/\n", from_lark).find("lookahead"), std::string::npos);
  EXPECT_NE(error_of("start: /a/i\n", from_lark).find("regex flags"), std::string::npos);
  EXPECT_NE(error_of("start: x\n", from_lark).find("line 1, column 8: undefined rule 'x'"),
            std::string::npos);
}

// The full-vocabulary mask agrees with feeding every token, on a recursive GBNF grammar.
TEST(Gbnf, MaskMatchesTokenByTokenFeeding) {
  std::vector<std::string> v = {"<s>", "</s>"};
  for (const char* s : {"[", "]", ",", "a", "b", "ab", "[a", "a,", "],", "[]", "[[", "]]", ",[", "b]", "x"})
    v.push_back(s);
  auto vocab = std::make_shared<TokenVocab>(v, std::vector<int>{0, 1}, std::vector<int>{1});
  auto g = compile(
      from_gbnf("root ::= list\nlist ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [ab]+ | list\n"), vocab);
  std::vector<uint32_t> mask(vocab->mask_words());
  for (std::string out : {"[ab,[a,[]],b]", "[]", "[[[b]]]"}) {
    Matcher m(g);
    for (size_t i = 0;; ++i) {
      m.fill_mask(mask.data());
      for (size_t t = 0; t < vocab->size(); ++t)
        ASSERT_EQ(bool((mask[t >> 5] >> (t & 31)) & 1), m.allows(int(t)))
            << "token '" << v[t] << "' after '" << out.substr(0, i) << "'";
      if (i == out.size()) break;
      ASSERT_TRUE(m.accept_bytes(out.substr(i, 1)));
    }
    EXPECT_TRUE(m.is_accepting());
  }
}

}  // namespace
}  // namespace beluga::grammar
