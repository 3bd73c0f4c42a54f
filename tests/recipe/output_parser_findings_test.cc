// Regression tests for the output parser's fuzz findings (tests/fuzz/corpus/output_parser): each input
// is decoded as fuzz_output_parser.cc decodes it (two option bytes, then model output) and must give
// the same joined events and finish reason whole, byte by byte, split in two at every position, and at
// the fuzz target's own split points.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../fuzz/fuzz_support.h"
#include "parser_test_support.h"
#include "util/file.h"

namespace beluga::recipe::test {
namespace {

struct Finding {
  ParserOptions options;
  bool engine_length = false;
  std::string text;
};

// The option decoding of tests/fuzz/fuzz_output_parser.cc.
Finding decode(const std::string& data) {
  const uint8_t a = data.at(0), b = data.at(1);
  static const ToolSyntax kSyntaxes[] = {ToolSyntax::kNone, ToolSyntax::kV3,     ToolSyntax::kV31,
                                         ToolSyntax::kDsml, ToolSyntax::kHermes, ToolSyntax::kLlama3Json};
  static const char* kStops[] = {"", "\n\n", "</", "<｜end▁of▁sentence｜>", "}", "ab"};
  Finding f;
  f.options.tools = kSyntaxes[a % 6];
  f.options.start_in_reasoning = a & 8;
  f.options.start_in_tool_calls = (a & 16) && f.options.tools == ToolSyntax::kDsml;
  f.options.think_tags = a & 32;
  f.options.json_mode = a & 64;
  if (b % 6) f.options.stop.push_back(kStops[b % 6]);
  f.engine_length = b & 128;
  f.text = data.substr(2);
  return f;
}

// The chunks fuzz_output_parser.cc feeds.
std::vector<std::string> fuzz_schedule(const std::string& text) {
  std::vector<std::string> chunks;
  fuzz::Splitter s(text);
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = std::min(text.size() - pos, s.next(8));
    chunks.push_back(text.substr(pos, n));
    pos += n;
  }
  return chunks;
}

Result check_finding(const std::string& name) {
  const Finding f = decode(read_file(source_path("tests/fuzz/corpus/output_parser/" + name)));
  Result whole = parse_all_ways(f.options, f.text, f.engine_length);
  Result fuzz = run(f.options, fuzz_schedule(f.text), f.engine_length);
  EXPECT_EQ(fuzz.events, whole.events) << "the fuzz target's split points differ";
  EXPECT_EQ(fuzz.finish, whole.finish);
  return whole;
}

// Both findings: JSON mode with Hermes calls, a `<tool_call>` block that is not a call (replayed as
// text, so padded) and invalid UTF-8 in it. The padding counted lead bytes of raw text but U+FFFD
// characters of replayed text, so an incomplete sequence held at a chunk end changed its length.
TEST(OutputParserFindings, HermesJsonModeSplit2d7c16ad) {
  Result r = check_finding("output_parser-split-2d7c16ad");
  EXPECT_FALSE(r.events.empty());
}

TEST(OutputParserFindings, HermesJsonModeSplitA5070547) {
  Result r = check_finding("output_parser-split-a5070547");
  EXPECT_FALSE(r.events.empty());
}

// The cause, small: invalid bytes pad one space each, whether they reach the padding directly or
// through a rejected call (already replaced by U+FFFD), at any split.
TEST(OutputParserFindings, JsonModePadsInvalidUtf8OnePerByte) {
  ParserOptions o;
  o.tools = ToolSyntax::kHermes;
  o.json_mode = true;
  const std::string bad = "\xef\x84\xe6\x91";  // two truncated 3-byte sequences: four invalid bytes
  Result direct = parse_all_ways(o, "ok " + bad + " {\"a\": 1}");
  EXPECT_EQ(text_of(direct, K::kContent), std::string(3 + 4 + 1, ' ') + "{\"a\": 1}");
  Result replayed = parse_all_ways(o, "ok <tool_call>" + bad + "name\n</tool_call> {\"a\": 1}");
  const std::string padding(3 + 11 + 4 + 5 + 12 + 1, ' ');  // "ok ", the block, " "
  EXPECT_EQ(text_of(replayed, K::kContent), padding + "{\"a\": 1}");
  EXPECT_TRUE(calls_of(replayed).empty());
}

}  // namespace
}  // namespace beluga::recipe::test
