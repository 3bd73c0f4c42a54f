// Invalid UTF-8 input is repaired (U+FFFD per maximal invalid subpart), never a crash; decode always
// returns valid UTF-8.
#include <gtest/gtest.h>

#include <random>

#include "test_support.h"
#include "tokenizer/utf8.h"

namespace beluga::tok {
namespace {

using namespace beluga::tok::testing;

TEST(InvalidUtf8, RandomBytesEncodeAsTheirRepair) {
  ASSERT_TRUE(have_node_tools()) << kNodeToolsHint;
  for (const std::string& path : {deepseek_v3_path(), qwen3_path()}) {
    const Tokenizer& tok = load(path);
    std::mt19937 rng(11);
    for (int round = 0; round < 300; ++round) {
      std::string s(rng() % 64, '\0');
      for (char& c : s) c = static_cast<char>(rng() % 4 ? 0x80 + rng() % 128 : rng() % 128);
      std::string repaired;
      utf8_append_lossy(repaired, s);
      auto ids = tok.encode(s, true);
      EXPECT_EQ(ids, tok.encode(repaired, true));
      std::string back = tok.decode(ids);
      EXPECT_EQ(utf8_first_invalid(back), back.size());
    }
  }
}

TEST(InvalidUtf8, KnownRepairs) {
  const Tokenizer& tok = load(demo_coder_path());
  EXPECT_EQ(tok.decode(tok.encode("a\xFF"
                                  "b\xE4\xB8",
                                  false)),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode(tok.encode(std::string("nul\0byte", 8), false)), std::string("nul\0byte", 8));
  EXPECT_TRUE(tok.encode("", true).empty());
}

}  // namespace
}  // namespace beluga::tok
