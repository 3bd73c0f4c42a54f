// UTF-8 validation, lossy repair (WHATWG maximal-subpart rule) and completeness checks.
#include "tokenizer/utf8.h"

#include <gtest/gtest.h>

namespace beluga::tok {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string lossy(std::string_view s) {
  std::string out;
  utf8_append_lossy(out, s);
  return out;
}

TEST(Utf8, ValidTextPassesThrough) {
  std::string s = "a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";  // a é 中 😀
  EXPECT_EQ(utf8_first_invalid(s), s.size());
  EXPECT_EQ(lossy(s), s);
  size_t i = 0;
  EXPECT_EQ(utf8_decode(s, i), U'a');
  EXPECT_EQ(utf8_decode(s, i), U'é');
  EXPECT_EQ(utf8_decode(s, i), U'中');
  EXPECT_EQ(utf8_decode(s, i), U'😀');
  EXPECT_EQ(i, s.size());
}

TEST(Utf8, InvalidSequencesBecomeReplacementCharacters) {
  EXPECT_EQ(lossy("a\x80z"), "a" + kFffd + "z");            // stray continuation
  EXPECT_EQ(lossy("\xC0\xAF"), kFffd + kFffd);              // overlong lead: two subparts
  EXPECT_EQ(lossy("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(lossy("\xE4\xB8"), kFffd);                      // truncated 3-byte: one subpart
  EXPECT_EQ(lossy("\xE4\xB8z"), kFffd + "z");
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(lossy("\xFF"), kFffd);
  EXPECT_EQ(utf8_first_invalid("abcdefghij\xFF"), 10u);
}

TEST(Utf8, CompletePrefixHoldsBackOnlyAnUnfinishedCharacter) {
  size_t tail;
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8", tail), 2u);
  EXPECT_EQ(tail, 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xE4\xB8\xAD", tail), 5u);
  EXPECT_EQ(tail, 0u);
  EXPECT_EQ(utf8_complete_prefix("ab\xF0\x9F\x98", tail), 2u);
  // Bytes that can never complete are not held back: they are invalid now.
  EXPECT_EQ(utf8_complete_prefix("ab\xFF", tail), 3u);
  EXPECT_EQ(utf8_complete_prefix("ab\x80", tail), 3u);
  EXPECT_EQ(utf8_complete_prefix("\xE0\x80", tail), 2u);  // E0 80 is overlong already
}

}  // namespace
}  // namespace beluga::tok
