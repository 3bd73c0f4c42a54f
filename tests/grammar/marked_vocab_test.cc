// grammar/marked_vocab.h and grammar/compose.h: a marker special token is generated only as itself
// (its text spelled by ordinary tokens, or an ordinary token holding 0xFF, never matches the
// marker's sentinel), other special tokens stay forbidden, EOS keeps its role; an embedded grammar
// keeps its meaning inside a larger one.
#include <gtest/gtest.h>

#include "grammar/choice.h"
#include "grammar/compiled.h"
#include "grammar/compose.h"
#include "grammar/marked_vocab.h"
#include "grammar/matcher.h"

namespace beluga::grammar {
namespace {

// ids: 0 "a", 1 "<m>" (special: the marker), 2 "\xFF" (ordinary), 3 "<", 4 "m", 5 ">",
// 6 "</s>" (special: EOS), 7 "<x>" (special, not a marker), 8 "b", 9 "ab".
std::shared_ptr<const TokenVocab> base_vocab() {
  std::vector<std::string> bytes = {"a", "<m>", "\xFF", "<", "m", ">", "</s>", "<x>", "b", "ab"};
  return std::make_shared<TokenVocab>(bytes, std::vector<int>{1, 6, 7}, std::vector<int>{6});
}

bool feeds(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<int>& ids,
           bool* accepting = nullptr) {
  Matcher m(g);
  std::vector<uint32_t> mask(m.vocab().mask_words());
  for (int id : ids) {
    m.fill_mask(mask.data());
    const bool in_mask = (mask[size_t(id) >> 5] >> (id & 31)) & 1;
    EXPECT_EQ(in_mask, m.allows(id)) << "mask and matcher disagree on token " << id;
    if (!in_mask || !m.accept_token(id)) return false;
  }
  if (accepting) *accepting = m.is_accepting();
  return true;
}

TEST(MarkedVocab, MarkerIsGeneratedOnlyAsItself) {
  auto base = base_vocab();
  auto v = marked_vocab(*base, {1});
  EXPECT_TRUE(v->allowed(1));
  EXPECT_EQ(v->bytes(1), marker_bytes(0));
  EXPECT_FALSE(v->allowed(2));  // holds 0xFF: could forge a sentinel
  EXPECT_FALSE(v->allowed(7));  // special, not a marker
  EXPECT_EQ(v->eos(), std::vector<int>{6});

  Grammar g;
  g.root = g.add_rule("root");
  g.define(g.root, g.seq({g.literal(marker_bytes(0)), g.literal("ab")}));
  auto c = compile(g, v);
  bool acc = false;
  EXPECT_TRUE(feeds(c, {1, 0, 8}, &acc));
  EXPECT_TRUE(acc);
  EXPECT_TRUE(feeds(c, {1, 9, 6}));         // "ab" in one token, then EOS where the grammar is complete
  EXPECT_FALSE(feeds(c, {3, 4, 5, 0, 8}));  // the marker's text as ordinary tokens
  EXPECT_FALSE(feeds(c, {2}));
  EXPECT_FALSE(feeds(c, {7}));
  EXPECT_FALSE(feeds(c, {1, 6}));  // EOS before the grammar is complete
}

TEST(Compose, EmbeddedGrammarKeepsItsMeaning) {
  Grammar inner = choice_grammar({"a", "ab", "b"});
  Grammar g;
  g.root = g.add_rule("root");
  const int r = embed(g, inner, "inner.");
  EXPECT_EQ(g.rule_names[size_t(r)], "inner.root");
  g.define(g.root, g.seq({g.literal("<"), g.ref(r), g.literal(">")}));
  auto v = base_vocab();
  auto c = compile(g, v);
  bool acc = false;
  EXPECT_TRUE(feeds(c, {3, 9, 5}, &acc));
  EXPECT_TRUE(acc);
  EXPECT_TRUE(feeds(c, {3, 8, 5}, &acc));
  EXPECT_TRUE(acc);
  EXPECT_FALSE(feeds(c, {3, 4}));     // "m" is no choice
  EXPECT_FALSE(feeds(c, {3, 8, 8}));  // "bb" is no choice
}

}  // namespace
}  // namespace beluga::grammar
