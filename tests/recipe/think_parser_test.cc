// Qwen3-style `<think>` reasoning through the output parser: opened by the model at the start of its
// reply (think_tags) or by the prompt (start_in_reasoning). Split at every byte (parse_all_ways).
#include <gtest/gtest.h>

#include "parser_test_support.h"
#include "recipe/output_parser.h"

namespace beluga::recipe {
namespace {

using test::K;
using test::parse_all_ways;
using test::Result;
using test::text_of;

ParserOptions think() {
  ParserOptions o;
  o.think_tags = true;
  return o;
}

TEST(ThinkParser, ModelOpensReasoning) {
  Result r = parse_all_ways(think(), "<think>\nLet me think — ok 🐳.\n</think>\n\nThe answer is 4.");
  EXPECT_EQ(text_of(r, K::kReasoning), "Let me think — ok 🐳.");  // newlines around it dropped
  EXPECT_EQ(text_of(r, K::kContent), "The answer is 4.");
  EXPECT_EQ(r.finish, FinishReason::kStop);
}

TEST(ThinkParser, LeadingWhitespaceAndEmptyThinking) {
  // Qwen3 with thinking off may still write an empty block; whitespace may precede it.
  Result r = parse_all_ways(think(), " \n<think>\n\n</think>\n\nHi");
  EXPECT_EQ(text_of(r, K::kReasoning), "");
  EXPECT_EQ(text_of(r, K::kContent), "Hi");
}

TEST(ThinkParser, ThinkLaterIsText) {
  const std::string text = "Plain answer; <think> is a tag name.";
  Result r = parse_all_ways(think(), text);
  EXPECT_EQ(text_of(r, K::kReasoning), "");
  EXPECT_EQ(text_of(r, K::kContent), text);
}

TEST(ThinkParser, WithoutThinkTagsItIsText) {
  Result r = parse_all_ways(ParserOptions{}, "<think>x");
  EXPECT_EQ(text_of(r, K::kContent), "<think>x");
}

TEST(ThinkParser, PromptOpenedReasoning) {
  ParserOptions o = think();
  o.start_in_reasoning = true;  // the generation prompt ended with `<think>\n`
  Result r = parse_all_ways(o, "step 1\nstep 2\n</think>\n\n<think> is text now");
  EXPECT_EQ(text_of(r, K::kReasoning), "step 1\nstep 2");
  EXPECT_EQ(text_of(r, K::kContent), "<think> is text now");
}

TEST(ThinkParser, CutShortWhileThinking) {
  Result r = parse_all_ways(think(), "<think>\nstill going", /*length=*/true);
  EXPECT_EQ(text_of(r, K::kReasoning), "still going");
  EXPECT_EQ(text_of(r, K::kContent), "");
  EXPECT_EQ(r.finish, FinishReason::kLength);
}

TEST(ThinkParser, PartialOpenerAtTheEndIsContent) {
  Result r = parse_all_ways(think(), "\n<thi");
  EXPECT_EQ(text_of(r, K::kContent), "<thi");
}

TEST(ThinkParser, StopSequencesApplyToTheAnswer) {
  ParserOptions o = think();
  o.stop = {"END"};
  Result r = parse_all_ways(o, "<think>END is a word</think>answer END rest");
  EXPECT_EQ(text_of(r, K::kReasoning), "END is a word");
  EXPECT_EQ(text_of(r, K::kContent), "answer ");
  EXPECT_EQ(r.stop, "END");
}

TEST(ThinkParser, LlamaCallAfterReasoning) {
  ParserOptions o = think();
  o.tools = ToolSyntax::kLlama3Json;
  Result r = parse_all_ways(o, "<think>use f</think>\n{\"name\": \"f\", \"parameters\": {}}");
  EXPECT_EQ(text_of(r, K::kReasoning), "use f");
  ASSERT_EQ(test::calls_of(r).size(), 1u);
}

}  // namespace
}  // namespace beluga::recipe
