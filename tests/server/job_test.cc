// StopMatcher and the usage / id helpers of the API formatters.
#include <gtest/gtest.h>

#include "server/api_format.h"
#include "server/job.h"
#include "server/sse.h"

namespace beluga::server {
namespace {

std::string feed_all(StopMatcher& m, const std::vector<std::string>& chunks, bool* hit) {
  std::string out;
  *hit = false;
  for (const auto& c : chunks) {
    if (m.feed(c, out)) {
      *hit = true;
      return out;
    }
  }
  out += m.flush();
  return out;
}

TEST(TokenText, PartialUtf8BytesAreEscaped) {
  EXPECT_EQ(token_text_of_bytes("hello"), "hello");
  EXPECT_EQ(token_text_of_bytes("\xc3\xa9t\xc3\xa9"), "\xc3\xa9t\xc3\xa9");  // whole characters stay
  EXPECT_EQ(token_text_of_bytes("\xe2\x80"), "\\xe2\\x80");                  // the start of a character
  EXPECT_EQ(token_text_of_bytes("\x9f\x98\x80!"), "\\x9f\\x98\\x80!");       // the end of one
  EXPECT_EQ(token_text_of_bytes("a\xf0\x9f"), "a\\xf0\\x9f");
  EXPECT_EQ(token_text_of_bytes(""), "");
}

TEST(StopMatcher, FindsStopsAcrossChunkBoundaries) {
  bool hit = false;
  StopMatcher a({"f "});
  EXPECT_EQ(feed_all(a, {"def", " read"}, &hit), "de");
  EXPECT_TRUE(hit);
  EXPECT_EQ(a.matched(), "f ");
  StopMatcher b({"STOP", "xyz"});
  EXPECT_EQ(feed_all(b, {"abcS", "TO", "xy", "P tail"}, &hit), "abcSTOxyP tail");
  EXPECT_FALSE(hit);
  StopMatcher c({"STOP", "xyz"});
  EXPECT_EQ(feed_all(c, {"abcS", "TO", "P tail"}, &hit), "abc");
  EXPECT_TRUE(hit);
  StopMatcher d({"", "zz"});
  EXPECT_EQ(feed_all(d, {"a", "z", "b"}, &hit), "azb");
  StopMatcher e({"lo", "hello"});  // the earliest match wins
  EXPECT_EQ(feed_all(e, {"hel", "lo"}, &hit), "");
  EXPECT_EQ(e.matched(), "hello");
}

TEST(StopMatcher, HeldTextIsReleasedOnlyWhenItCannotStartAStop) {
  StopMatcher m({"abc"});
  std::string out;
  EXPECT_FALSE(m.feed("xxab", out));
  EXPECT_EQ(out, "xx");
  EXPECT_FALSE(m.feed("d", out));
  EXPECT_EQ(out, "xxabd");
}

TEST(Usage, OpenAIUsageCarriesCacheFields) {
  Usage u{100, 64, 10, 0};
  auto j = openai_usage(u);
  EXPECT_EQ(j["prompt_cache_hit_tokens"], 64);
  EXPECT_EQ(j["prompt_cache_miss_tokens"], 36);
  EXPECT_EQ(j["prompt_tokens_details"]["cached_tokens"], 64);
  EXPECT_EQ(j["total_tokens"], 110);
  auto a = anthropic_usage(u);
  EXPECT_EQ(a["input_tokens"], 36);
  EXPECT_EQ(a["cache_read_input_tokens"], 64);
  EXPECT_EQ(responses_usage(u)["input_tokens_details"]["cached_tokens"], 64);
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse_data({{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(sse_event("ping", {{"type", "ping"}}), "event: ping\ndata: {\"type\":\"ping\"}\n\n");
  EXPECT_EQ(http_chunk("hello"), "5\r\nhello\r\n");
  EXPECT_EQ(http_chunk(""), "0\r\n\r\n");
  EXPECT_EQ(random_id("call_").size(), 5u + 24u);
  EXPECT_EQ(arguments_object("{\"x\": 1}")["x"], 1);
  EXPECT_EQ(arguments_object("not json")["arguments"], "not json");
}

}  // namespace
}  // namespace beluga::server
