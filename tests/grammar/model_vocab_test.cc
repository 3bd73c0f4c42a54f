// grammar/vocab.h with a model vocabulary larger than the tokenizer's (padded embeddings, or a
// benchmark serving a model with another model's tokenizer): ids past the tokenizer are never allowed,
// an EOS id among them still ends generation where the grammar is complete, and the mask the engine
// applies (GrammarProcessor, over the model's logit count) matches.
#include <gtest/gtest.h>

#include "grammar/check.h"
#include "grammar/grammar_processor.h"
#include "grammar/matcher.h"
#include "tokenizer/tokenizer.h"

namespace beluga::grammar {
namespace {

bool bit(const std::vector<uint32_t>& mask, int id) {
  return (mask[size_t(id) >> 5] >> (id & 31)) & 1;
}

TEST(ModelVocab, IdsPastTheTokenizerAreNeverAllowedButTheirEosEndsGeneration) {
  const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";
  const auto tokenizer = tok::Tokenizer::from_file(dir + "/tokenizer.json");
  const int n = int(tokenizer.vocab_size());
  const int model_vocab = n + 1000, eos = n + 777;             // an EOS id the tokenizer does not have
  EXPECT_THROW(TokenVocab(tokenizer, {eos}), std::exception);  // without the model's size it is refused

  auto vocab = std::make_shared<const TokenVocab>(tokenizer, std::vector<int>{eos}, size_t(model_vocab));
  ASSERT_EQ(vocab->size(), size_t(model_vocab));
  for (int id = n; id < model_vocab; ++id) EXPECT_FALSE(vocab->allowed(id)) << id;

  auto g = compile_json_schema(nlohmann::ordered_json::parse(R"({"enum":[7]})"), vocab, {},
                               std::chrono::milliseconds(10'000));
  ASSERT_TRUE(g);
  GrammarProcessor proc(g);
  std::vector<uint32_t> mask((size_t(model_vocab) + 31) / 32);
  proc.fill_mask(mask.data(), model_vocab);
  EXPECT_FALSE(bit(mask, eos)) << "EOS before the value is complete";
  const std::vector<int> seven = tokenizer.encode("7", false);
  ASSERT_EQ(seven.size(), 1u);
  EXPECT_TRUE(bit(mask, seven[0]));
  for (int id = n; id < model_vocab; ++id) ASSERT_FALSE(bit(mask, id)) << id;
  proc.accept(seven[0]);
  proc.fill_mask(mask.data(), model_vocab);
  EXPECT_TRUE(bit(mask, eos)) << "EOS once the value is complete";
  for (int id = n; id < model_vocab; ++id) {
    if (id != eos) {
      ASSERT_FALSE(bit(mask, id)) << id;
    }
  }
}

}  // namespace
}  // namespace beluga::grammar
