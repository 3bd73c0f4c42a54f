// Shared masks (mask_classes.h) against one vocabulary walk per node: for grammars with bounded
// repetitions, numeric bounds, formats, arrays and a GBNF, every node's mask compiled with sharing
// equals the mask compiled for that node alone (accepted set, uncertain tokens with their offsets),
// and bounded strings share most of their masks.
#include <gtest/gtest.h>

#include <algorithm>

#include "grammar/compiled.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/mask_classes.h"
#include "grammar/regex.h"

namespace beluga::grammar {
namespace {

// Short JSON pieces, runs of 'a' up to 25 bytes (long enough to reach across the bounds of the
// strings below) alone and closing the string, digits, and a special and an EOS token.
std::shared_ptr<const TokenVocab> runs_vocab() {
  std::vector<std::string> v = {"<s>", "</s>"};
  for (char c : std::string("{}[]\":,0123456789.-+eEabcxyzTZ: \\n")) v.push_back(std::string(1, c));
  for (size_t k = 2; k <= 25; ++k) {
    v.push_back(std::string(k, 'a'));
    v.push_back(std::string(k, 'a') + "\"");
    v.push_back("\"" + std::string(k, 'a'));
  }
  for (const char* s : {"\",\"", "\":\"", "\"}", "\"]",   "12", "99",  "100", "-1",      "2024",
                        "-12-",  "T1",    ":00", "Z\"",   "1]", "12]", "a]",  "\"a\":",  "\"b\":",
                        "],[",   "},{",   "\\n", "\\u00", "ab", "ba",  "abc", "\xc3\xa9"})
    v.push_back(s);
  return std::make_shared<TokenVocab>(v, std::vector<int>{0}, std::vector<int>{1});
}

// A node's mask as sets, independent of how it is stored.
struct Normalized {
  std::vector<int32_t> accepted;
  std::vector<std::pair<int32_t, int32_t>> uncertain;
  bool operator==(const Normalized&) const = default;
};

Normalized normalized(const NodeMask& m, const TokenVocab& v) {
  Normalized n;
  if (!m.complement) {
    n.accepted = m.ids;
  } else {
    for (int32_t t : v.sorted())
      if (std::find(m.ids.begin(), m.ids.end(), t) == m.ids.end()) n.accepted.push_back(t);
  }
  std::sort(n.accepted.begin(), n.accepted.end());
  n.uncertain = m.uncertain;
  std::sort(n.uncertain.begin(), n.uncertain.end());
  return n;
}

// Compiles `g` both ways and compares every node; returns the shared compilation.
std::shared_ptr<const CompiledGrammar> expect_same_masks(const Grammar& g, const std::string& what) {
  auto v = runs_vocab();
  CompileOptions alone;
  alone.share_equal_masks = false;
  auto ref = compile(g, v, alone);
  auto shared = compile(g, v);
  EXPECT_EQ(ref->automaton.nodes.size(), shared->automaton.nodes.size()) << what;
  size_t differing = 0;
  for (size_t n = 0; n < ref->automaton.nodes.size(); ++n) {
    int32_t r = ref->mask_of_node[n], s = shared->mask_of_node[n];
    EXPECT_EQ(r < 0, s < 0) << what << ": node " << n;
    if (r < 0 || s < 0) continue;
    if (!(normalized(ref->masks[r], *v) == normalized(shared->masks[s], *v))) ++differing;
  }
  EXPECT_EQ(differing, 0u) << what << ": nodes whose shared mask differs from their own";
  EXPECT_LE(shared->masks.size(), ref->masks.size()) << what;
  return shared;
}

Grammar schema_grammar(const char* text) {
  return json_schema_grammar(nlohmann::ordered_json::parse(text));
}

TEST(MaskClasses, SharedMasksEqualEachNodesOwnMask) {
  for (const char* s : {
           R"({"type":"string","minLength":3,"maxLength":40})",
           R"({"type":"string","minLength":30})",
           R"({"type":"string","maxLength":12})",
           R"({"type":"string","pattern":"^a{5,30}b?$"})",
           R"({"type":"integer","minimum":-120,"maximum":2024})",
           R"({"type":"number","minimum":-3,"maximum":99})",
           R"({"type":"string","format":"date-time"})",
           R"({"type":"array","items":{"type":"integer"},"minItems":4,"maxItems":9})",
           R"({"type":"object","properties":{"a":{"type":"string","minLength":2,"maxLength":28},
               "b":{"type":"array","items":{"type":"string","maxLength":5},"minItems":2}},"required":["a","b"]})",
       })
    expect_same_masks(schema_grammar(s), s);
  expect_same_masks(from_regex("(ab|ba){3,9}c*"), "regex");
  expect_same_masks(from_gbnf(R"(root ::= "[" item ("," item){2,6} "]"
item ::= "\"" [a-c]{1,20} "\"" | [0-9]+)"),
                    "gbnf");
  // A rule that may end where it may also go on: the end must split otherwise equal nodes.
  expect_same_masks(
      from_gbnf("root ::= \"[\" item \"]\" item\nitem ::= [a-c]+ | \"x\" num\nnum ::= [0-9] [0-9]+"), "ends");
}

TEST(MaskClasses, BoundedStringsShareMostMasks) {
  // Positions of a 300-character minimum farther than the longest token (26 bytes) from its bound
  // behave alike: a tenth as many masks as nodes, not one per node.
  auto g =
      expect_same_masks(schema_grammar(R"({"type":"string","minLength":300,"maxLength":600})"), "bounded");
  size_t with_edges = 0;
  for (const auto& n : g->automaton.nodes) with_edges += n.has_edges();
  EXPECT_GT(with_edges, 6000u);
  EXPECT_LT(g->masks.size() * 10, with_edges) << "of " << with_edges << " nodes with byte edges";
}

TEST(MaskClasses, DepthZeroSeparatesOnlyByRuleAndEnd) {
  // With no lookahead a plain rule's nodes split only by (rule, final, has edges): the partition is
  // the coarsest, and deeper rounds only refine it.
  auto cg = compile(schema_grammar(R"({"type":"string","minLength":5,"maxLength":9})"), runs_vocab());
  MaskClasses d0 = mask_classes(cg->automaton, 0), d3 = mask_classes(cg->automaton, 3);
  ASSERT_EQ(d0.of_node.size(), d3.of_node.size());
  // Ids are numbered in the order of each class's first node (the compiler builds masks in that order).
  int32_t next = 0;
  for (int32_t c : d3.of_node) {
    ASSERT_LE(c, next);
    if (c == next) ++next;
  }
  EXPECT_EQ(next, d3.count);
  EXPECT_LE(d0.count, d3.count);
  for (size_t i = 0; i < d0.of_node.size(); ++i)
    for (size_t j = 0; j < i; ++j) {
      if (d3.of_node[i] >= 0 && d3.of_node[i] == d3.of_node[j]) {
        EXPECT_EQ(d0.of_node[i], d0.of_node[j]);
      }
    }
}

}  // namespace
}  // namespace beluga::grammar
