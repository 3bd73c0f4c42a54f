// Pre-tokenizer splitting: the five split behaviours (the examples of Hugging Face's documentation),
// invert, sequences, and the Oniguruma -> PCRE2 translation of \s.
#include "tokenizer/pre_tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace beluga::tok {
namespace {

using nlohmann::json;

json split(const std::string& regex, const std::string& behavior, bool invert = false) {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}, {"invert", invert}};
}

std::vector<std::string> words(const json& pre, const std::string& text) {
  json seq = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array({pre, {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  auto p = PreTokenizer::from_json(seq);
  std::vector<std::string> out;
  p.split(text, [&](std::string_view w) { out.emplace_back(w); });
  return out;
}

using V = std::vector<std::string>;

TEST(PreTokenizer, SplitBehaviours) {
  const std::string s = "the-final--countdown";
  EXPECT_EQ(words(split("-", "Removed"), s), (V{"the", "final", "countdown"}));
  EXPECT_EQ(words(split("-", "Isolated"), s), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(words(split("-", "MergedWithPrevious"), s), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(words(split("-", "MergedWithNext"), s), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(words(split("-", "Contiguous"), s), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(words(split("-", "Removed", /*invert=*/true), s), (V{"-", "-", "-"}));
}

TEST(PreTokenizer, SequenceAppliesStagesToEachPiece) {
  json seq = {{"type", "Sequence"},
              {"pretokenizers",
               json::array({{{"type", "Digits"}, {"individual_digits", false}}, split(" ", "Removed")})}};
  EXPECT_EQ(words(seq, "ab12 c345d"), (V{"ab", "12", "c", "345", "d"}));
}

TEST(PreTokenizer, Gpt2RegexAndPrefixSpace) {
  auto p = PreTokenizer::from_json({{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}});
  EXPECT_TRUE(p.byte_level());
  V out;
  p.split("Hello world's  end", [&](std::string_view w) { out.emplace_back(w); });
  EXPECT_EQ(out, (V{" Hello", " world", "'s", " ", " end"}));
}

TEST(PreTokenizer, OnigurumaSemantics) {
  // \s is Unicode White_Space in Oniguruma, U+0085 (NEL) included.
  EXPECT_EQ(words(split("\\s+", "Removed"),
                  "a\xC2\x85"
                  "b\xE3\x80\x80"
                  "c"),
            (V{"a", "b", "c"}));
  // \h is a hex digit in Oniguruma (horizontal space in PCRE2).
  EXPECT_EQ(onig_to_pcre2("\\h+[\\h_]\\H"), "[0-9a-fA-F]+[0-9a-fA-F_][^0-9a-fA-F]");
  EXPECT_EQ(words(split("\\h+", "Isolated"), "xx ff0 z"), (V{"xx ", "ff0", " z"}));
}

TEST(PreTokenizer, UnsupportedTypeIsAnError) {
  EXPECT_THROW(PreTokenizer::from_json({{"type", "Metaspace"}}), std::exception);
  EXPECT_THROW(PreTokenizer::from_json(split("(", "Isolated")), std::exception);  // bad regex
}

}  // namespace
}  // namespace beluga::tok
