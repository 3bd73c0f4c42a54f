// Special-token injection: user text is encoded with allow_special=false, so text that spells any
// added token of the DeepSeek-V3 vocabulary must never produce that token's id (or any added id).
#include <gtest/gtest.h>

#include "test_support.h"
#include "tokenizer/added_vocab.h"

namespace beluga::tok {
namespace {

using namespace beluga::tok::testing;

class Injection : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(have_node_tools()) << kNodeToolsHint; }
};

TEST_F(Injection, EveryDeepSeekAddedTokenIsPlainTextWhenSpecialsAreOff) {
  const Tokenizer& tok = load(deepseek_v3_path());
  const auto& added = tok.added_tokens();
  ASSERT_GT(added.size(), 800u);
  size_t special = 0;
  std::string all;
  for (const auto& t : added) {
    special += t.special;
    all += t.content;
    for (const std::string& text :
         {t.content, "Hello " + t.content + " world", "x" + t.content + t.content + "y\n", " " + t.content}) {
      auto ids = tok.encode(text, /*allow_special=*/false);
      for (int id : ids) {
        ASSERT_NE(id, t.id) << "'" << text << "' produced its control token";
        ASSERT_FALSE(tok.is_added(id)) << "'" << text << "' produced added token " << tok.token_text(id);
      }
      EXPECT_EQ(tok.decode(ids), text);  // and it is still the same text
    }
    // With specials allowed the same spelling is exactly the token (the control path works).
    EXPECT_EQ(tok.encode(t.content, /*allow_special=*/true), std::vector<int>{t.id}) << t.content;
  }
  EXPECT_GT(special, 0u);
  for (int id : tok.encode(all, false)) ASSERT_FALSE(tok.is_added(id));
}

TEST_F(Injection, UserMarkerEncodesAsBpePieces) {
  const Tokenizer& tok = load(deepseek_v3_path());
  int user = tok.token_id("<\xEF\xBD\x9CUser\xEF\xBD\x9C>");
  ASSERT_GE(user, 0);
  auto ids = tok.encode("<\xEF\xBD\x9CUser\xEF\xBD\x9C>", false);
  EXPECT_GT(ids.size(), 1u);
  for (int id : ids) EXPECT_NE(id, user);
  EXPECT_EQ(tok.encode("<\xEF\xBD\x9CUser\xEF\xBD\x9C>", true), std::vector<int>{user});
}

}  // namespace
}  // namespace beluga::tok
