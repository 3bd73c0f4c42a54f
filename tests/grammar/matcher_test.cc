// The matcher on small hand-written grammars and schemas: byte-level stepping, rollback, accepting
// states, and fill_mask agreeing with feeding each token one by one (the slow reference).
#include <gtest/gtest.h>

#include <random>

#include "grammar/compiled.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/refused.h"

namespace beluga::grammar {
namespace {

// A vocabulary of all 1- and 2-byte strings over a small alphabet plus some longer JSON-ish pieces,
// a special token (id 0) and an EOS (id 1).
std::shared_ptr<const TokenVocab> small_vocab() {
  std::vector<std::string> v = {"<s>", "</s>"};
  std::string alpha = "{}[]\":,0123456789.+-abcnulltrefsxyz \\é";
  for (char a : alpha) v.push_back(std::string(1, a));
  for (char a : alpha)
    for (char b : std::string("\":,}]0a1\\")) v.push_back(std::string{a, b});
  for (const char* s : {"null", "true", "false", "\"a\"", "\":", "\",\"", "},{", "\"}", "12", "-0", "1.5",
                        "e+", "\xc3", "\xa9", "\xc3\xa9\"", "\"x\":", "[1,2]", "\"abc\""})
    v.push_back(s);
  return std::make_shared<TokenVocab>(v, std::vector<int>{0, 1}, std::vector<int>{1});
}

std::shared_ptr<const CompiledGrammar> vocab_schema(const char* text,
                                                    std::shared_ptr<const TokenVocab> v = small_vocab()) {
  return compile(json_schema_grammar(nlohmann::ordered_json::parse(text)), v);
}

bool matches(std::shared_ptr<const CompiledGrammar> g, std::string_view s) {
  Matcher m(g);
  return m.accept_bytes(s) && m.is_accepting();
}

TEST(GrammarMatcher, AcceptsExactlyTheSchemaLanguage) {
  auto g = vocab_schema(R"({"type":"object","properties":{"a":{"type":"integer","minimum":-5,"maximum":120},
                      "b":{"enum":["x",null,1.5]}},"required":["a"],"additionalProperties":false})");
  EXPECT_TRUE(matches(g, R"({"a":7})"));
  EXPECT_TRUE(matches(g, R"({"a":-5,"b":"x"})"));
  EXPECT_TRUE(matches(g, R"({"b":null,"a":120})"));  // any order for small objects
  EXPECT_FALSE(matches(g, R"({"a":121})"));
  EXPECT_FALSE(matches(g, R"({"a":-6})"));
  EXPECT_FALSE(matches(g, R"({"b":"x"})"));      // a is required
  EXPECT_FALSE(matches(g, R"({"a":1,"a":2})"));  // no duplicate declared keys
  EXPECT_FALSE(matches(g, R"({"a":1,"c":2})"));  // no additional properties
  EXPECT_FALSE(matches(g, R"({"a":01})"));
  EXPECT_FALSE(matches(g, R"({"a":1} )"));  // compact by default
}

TEST(GrammarMatcher, StringsAreCanonicalUtf8AndCountCharacters) {
  auto g = vocab_schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(matches(g, "\"ab\""));
  EXPECT_TRUE(matches(g, "\"a\xc3\xa9\""));  // é is one character
  EXPECT_TRUE(matches(g, "\"\\n\\\"x\""));   // escapes count as one
  EXPECT_FALSE(matches(g, "\"a\""));
  EXPECT_FALSE(matches(g, "\"abcd\""));
  EXPECT_FALSE(matches(g, "\"a\xc3\""));     // broken UTF-8
  EXPECT_FALSE(matches(g, "\"\\u0041b\""));  // 'A' has a plain spelling
  EXPECT_TRUE(matches(g, "\"\\u001fb\""));   // a control character does not
  EXPECT_FALSE(matches(g, "\"a\x01\""));     // raw control characters are not JSON
}

TEST(GrammarMatcher, AdditionalKeysExcludeDeclaredOnes) {
  auto g =
      vocab_schema(R"({"properties":{"ab":{"type":"string"}},"additionalProperties":{"type":"integer"}})");
  EXPECT_TRUE(matches(g, R"({"ab":"s","a":1,"abc":2,"b":3})"));
  EXPECT_FALSE(matches(g, R"({"ab":1})"));  // "ab" is declared: its schema applies, not the additional one
}

TEST(GrammarMatcher, RollbackRestoresEarlierStates) {
  auto g = vocab_schema(R"({"type":"array","items":{"type":"boolean"},"maxItems":2})");
  auto v = g->vocab;
  Matcher m(g);
  auto id = [&](std::string_view s) {
    for (size_t i = 0; i < v->size(); ++i)
      if (v->bytes(int(i)) == s) return int(i);
    ADD_FAILURE() << "no token " << s;
    return -1;
  };
  ASSERT_TRUE(m.accept_token(id("[")));
  ASSERT_TRUE(m.accept_token(id("true")));
  EXPECT_FALSE(m.accept_token(1));  // EOS only when complete
  ASSERT_TRUE(m.accept_token(id(",")));
  ASSERT_TRUE(m.accept_token(id("false")));
  EXPECT_FALSE(m.accept_token(id(",")));  // maxItems
  ASSERT_TRUE(m.accept_token(id("]")));
  EXPECT_TRUE(m.is_accepting());
  EXPECT_TRUE(m.accept_token(1));
  m.rollback(4);
  EXPECT_EQ(m.num_tokens(), 2);
  EXPECT_FALSE(m.is_accepting());
  EXPECT_TRUE(m.accept_token(id("]")));
  EXPECT_TRUE(m.is_accepting());
}

// fill_mask against accept_token for every token, along random valid outputs.
void expect_mask_exact(std::shared_ptr<const CompiledGrammar> g, const std::vector<std::string>& outputs) {
  auto v = g->vocab;
  std::vector<uint32_t> mask(v->mask_words());
  for (const auto& out : outputs) {
    Matcher m(g);
    size_t i = 0;
    std::mt19937 rng(42);
    while (true) {
      m.fill_mask(mask.data());
      for (size_t t = 0; t < v->size(); ++t) {
        bool bit = (mask[t >> 5] >> (t & 31)) & 1;
        ASSERT_EQ(bit, m.allows(int(t)))
            << "token " << t << " '" << v->bytes(int(t)) << "' after '" << out.substr(0, i) << "'";
      }
      if (i == out.size()) break;
      // Advance by a random token that is a prefix of the rest.
      std::vector<int> cands;
      for (size_t t = 2; t < v->size(); ++t)
        if (out.compare(i, v->bytes(int(t)).size(), v->bytes(int(t))) == 0) cands.push_back(int(t));
      ASSERT_FALSE(cands.empty()) << "no token for '" << out.substr(i) << "'";
      int t = cands[rng() % cands.size()];
      ASSERT_TRUE(m.accept_token(t)) << "'" << v->bytes(t) << "' after '" << out.substr(0, i) << "'";
      i += v->bytes(t).size();
    }
    EXPECT_TRUE(m.is_accepting()) << out;
  }
}

TEST(GrammarMatcher, MaskMatchesTokenByTokenFeeding) {
  expect_mask_exact(
      vocab_schema(R"({"type":"object","properties":{"x":{"type":"array","items":{"type":"number"}},
                               "y":{"$ref":"#/$defs/t"}},"$defs":{"t":{"type":"object","properties":{"y":{"$ref":"#/$defs/t"}}}}})"),
      {R"({"x":[1.5,-0,12e+3],"y":{"y":{}}})", R"({"y":{},"x":[]})", "{}"});
  expect_mask_exact(vocab_schema(R"({"type":"string"})"), {"\"a\\\"\xc3\xa9\"", "\"\""});
  expect_mask_exact(
      vocab_schema(R"({"anyOf":[{"type":"integer"},{"type":"array","items":{"type":"string"}}]})"),
      {"12", R"(["abc","a"])", "[]"});
  // Right-linear rules (multipleOf's digit automaton) and counted object states.
  expect_mask_exact(vocab_schema(R"({"type":"number","multipleOf":1.5})"), {"12", "-4.5", "0.0"});
  expect_mask_exact(vocab_schema(R"({"properties":{"a":{}},"minProperties":1,"maxProperties":2})"),
                    {R"({"a":1,"x":"y"})", R"({"xy":[1]})"});
  expect_mask_exact(vocab_schema(R"({"contains":{"type":"string"},"maxContains":1})"),
                    {R"([1,"a",null])", R"(["a"])"});
  // Keys split by a pattern (right-linear key rules from the product DFA).
  expect_mask_exact(
      vocab_schema(
          R"({"patternProperties":{"^a":{"type":"integer"}},"additionalProperties":{"type":"string"}})"),
      {R"({"ab":1,"x":"y","\\a":"z"})", R"({"b":"a"})"});
}

TEST(GrammarMatcher, RefusesWhatItCannotEnforce) {
  auto refused = [](const char* s) -> std::string {
    try {
      vocab_schema(s);
    } catch (const Refused& r) {
      return r.keyword();
    }
    return "";
  };
  EXPECT_EQ(refused(R"j({"type":"string","pattern":"^a(?=b)"})j"), "pattern");  // lookahead
  EXPECT_EQ(refused(R"({"type":"string","pattern":"^a","maxLength":3})"), "pattern");
  EXPECT_EQ(refused(R"({"not":{"type":"string","pattern":"a"}})"), "not");
  EXPECT_EQ(refused(R"({"oneOf":[{"pattern":"a"},{"minLength":2}]})"), "oneOf");
  EXPECT_EQ(refused(R"({"anyOf":[{"$ref":"#"},{"type":"null"}]})"), "left-recursion");
  EXPECT_EQ(refused(R"({"type":"string","format":"hostname"})"), "format");
  EXPECT_EQ(refused(R"({"$schema":"http://json-schema.org/draft-04/schema#","const":1})"), "const");
  EXPECT_EQ(refused(R"({"oneOf":[{"type":"integer"},{"type":"string"}]})"), "");
}

}  // namespace
}  // namespace beluga::grammar
