// The BPE merge loop on a tiny hand-made byte-level vocabulary: rank order, leftmost tie-breaking,
// ignore_merges, and thread safety of encode (the word cache is per thread).
#include <gtest/gtest.h>

#include <thread>

#include <nlohmann/json.hpp>

#include "test_support.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"

namespace beluga::tok {
namespace {

using namespace beluga::tok::testing;
using nlohmann::json;

// 256 byte tokens plus the merged tokens of `merges` ("left right" in byte-level spelling).
Tokenizer tiny(const std::vector<std::string>& merges, bool ignore_merges = false,
               const std::vector<std::string>& extra = {}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_encode(std::string(1, static_cast<char>(b)))] = b;
  int next = 256;
  for (const auto& m : merges) {
    std::string joined = m.substr(0, m.find(' ')) + m.substr(m.find(' ') + 1);
    if (!vocab.contains(joined)) vocab[joined] = next++;
  }
  for (const auto& e : extra) vocab[e] = next++;
  json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}, {"ignore_merges", ignore_merges}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", json::array()}};
  return Tokenizer::from_json(j.dump());
}

std::vector<std::string> pieces(const Tokenizer& t, const std::string& text) {
  std::vector<std::string> out;
  for (int id : t.encode(text, false)) out.emplace_back(t.token_bytes(id));
  return out;
}

using V = std::vector<std::string>;

TEST(Bpe, LowestRankMergesFirst) {
  EXPECT_EQ(pieces(tiny({"b c", "a b"}), "abc"), (V{"a", "bc"}));
  EXPECT_EQ(pieces(tiny({"a b", "b c"}), "abc"), (V{"ab", "c"}));
  EXPECT_EQ(pieces(tiny({"a b", "ab c", "b c"}), "abcabc"), (V{"abc", "abc"}));
}

TEST(Bpe, TiesGoLeftmost) {
  EXPECT_EQ(pieces(tiny({"a a"}), "aaa"), (V{"aa", "a"}));
  EXPECT_EQ(pieces(tiny({"a a", "aa aa"}), "aaaaa"), (V{"aaaa", "a"}));
}

TEST(Bpe, IgnoreMergesTakesWholeWords) {
  EXPECT_EQ(pieces(tiny({}, false, {"xyz"}), "xyz"), (V{"x", "y", "z"}));
  EXPECT_EQ(pieces(tiny({}, true, {"xyz"}), "xyz"), (V{"xyz"}));
}

TEST(Bpe, LongWordsAreFine) {
  auto t = tiny({"a a", "aa aa", "aaaa aaaa"});
  auto ids = t.encode(std::string(100001, 'a'), false);
  EXPECT_EQ(ids.size(), 12500u + 1);
}

TEST(Bpe, BadModelsAreRejected) {
  EXPECT_THROW(Tokenizer::from_json("{"), std::exception);
  EXPECT_THROW(Tokenizer::from_json(R"({"model":{"type":"Unigram","vocab":[]}})"), std::exception);
  json j = json::parse(R"({"model":{"type":"BPE","vocab":{"a":0},"merges":["a b"]},
                          "pre_tokenizer":{"type":"ByteLevel"}})");
  EXPECT_THROW(Tokenizer::from_json(j.dump()), std::exception);  // merge of a token not in the vocab
}

TEST(Bpe, ConcurrentEncodeMatchesSerial) {
  const Tokenizer& tok = load(demo_coder_path());
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i)
    texts.push_back("def f" + std::to_string(i) + "(x):\n    return x * " + std::to_string(i * 7919) +
                    " # \xE4\xB8\xAD\xE6\x96\x87 words words " + std::string(i, ' ') + "end");
  std::vector<std::vector<int>> serial;
  for (const auto& t : texts) serial.push_back(tok.encode(t, true));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int th = 0; th < 4; ++th) {
    threads.emplace_back([&, th] {
      for (int rep = 0; rep < 50; ++rep)
        for (size_t i = 0; i < texts.size(); ++i)
          if (tok.encode(texts[(i + th) % texts.size()], true) != serial[(i + th) % texts.size()]) ++bad[th];
    });
  }
  for (auto& t : threads) t.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

}  // namespace
}  // namespace beluga::tok
