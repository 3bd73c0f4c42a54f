// The streaming detokenizer never emits broken UTF-8, and its chunks add up to decode(ids).
#include "tokenizer/incremental_decoder.h"

#include <gtest/gtest.h>

#include <random>

#include "test_support.h"
#include "tokenizer/utf8.h"

namespace beluga::tok {
namespace {

using namespace beluga::tok::testing;

bool valid(const std::string& s) {
  return utf8_first_invalid(s) == s.size();
}

std::string stream(const Tokenizer& tok, const std::vector<int>& ids, size_t* held_max = nullptr) {
  IncrementalDecoder dec(tok);
  std::string all;
  for (int id : ids) {
    std::string chunk = dec.feed(id);
    EXPECT_TRUE(valid(chunk)) << "broken UTF-8 chunk after id " << id;
    if (held_max) *held_max = std::max(*held_max, dec.pending());
    all += chunk;
  }
  std::string rest = dec.flush();
  EXPECT_TRUE(valid(rest));
  return all + rest;
}

TEST(IncrementalDecoder, MultibyteTextSplitAcrossTokens) {
  const Tokenizer& tok = load(demo_coder_path());  // small vocab: CJK and emoji split inside characters
  std::string text =
      "\xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD caf\xC3\xA9 "
      "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 "
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";
  auto ids = tok.encode(text, false);
  size_t held = 0;
  EXPECT_EQ(stream(tok, ids, &held), text);
  EXPECT_GT(held, 0u) << "test text should split a character across tokens";
}

TEST(IncrementalDecoder, RandomIdsGiveValidChunksEqualToDecode) {
  const Tokenizer& tok = load(demo_coder_path());
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> any(0, static_cast<int>(tok.vocab_size()) + 10);  // some unknown ids too
  for (int round = 0; round < 200; ++round) {
    std::vector<int> ids(1 + rng() % 40);
    for (int& id : ids) id = any(rng);
    std::string whole = tok.decode(ids);
    EXPECT_TRUE(valid(whole));
    EXPECT_EQ(stream(tok, ids), whole);
  }
}

TEST(IncrementalDecoder, SkipSpecialAndUnfinishedTail) {
  const Tokenizer& tok = load(demo_coder_path());
  IncrementalDecoder dec(tok, /*skip_special=*/true);
  int bos = tok.token_id(
      "<\xEF\xBD\x9C"
      "begin\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>");
  ASSERT_TRUE(tok.is_special(bos));
  EXPECT_EQ(dec.feed(bos), "");
  // A lone lead byte token is held, then flushed as U+FFFD.
  int lead = tok.token_id(std::string("\xC3\xA4"));  // byte-level spelling of byte 0xE4
  ASSERT_GE(lead, 0);
  EXPECT_EQ(tok.token_bytes(lead), "\xE4");
  EXPECT_EQ(dec.feed(lead), "");
  EXPECT_EQ(dec.pending(), 1u);
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

}  // namespace
}  // namespace beluga::tok
