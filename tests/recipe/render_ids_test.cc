// End to end with the real tokenizer: the demo model's directory picks the DeepSeek-V3 format and
// the prompt ids equal those Hugging Face transformers produced (models/beluga-demo-coder-mtp/
// reference.safetensors, prompt_0 and prompt_1 of its README).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "recipe/chat_format.h"
#include "recipe/request.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace beluga::recipe {
namespace {

using test::kDemoModel;

std::vector<int> reference_ids(const std::string& name) {
  const std::string file = read_file(kDemoModel + "/reference.safetensors");
  uint64_t header_len;
  std::memcpy(&header_len, file.data(), 8);
  auto header = nlohmann::json::parse(file.substr(8, header_len));
  const auto& t = header.at(name);
  EXPECT_EQ(t.at("dtype"), "I64");
  size_t begin = t.at("data_offsets")[0], end = t.at("data_offsets")[1];
  std::vector<int> ids;
  for (size_t off = begin; off < end; off += 8) {
    int64_t v;
    std::memcpy(&v, file.data() + 8 + header_len + off, 8);
    ids.push_back(static_cast<int>(v));
  }
  return ids;
}

std::vector<int> render_ids(const ChatEncoder& enc, const tok::Tokenizer& tok, const std::string& user) {
  nlohmann::ordered_json body = {{"messages", {{{"role", "user"}, {"content", user}}}}};
  return enc.encode(parse_chat_request(body).conversation).ids(tok);
}

TEST(RenderIds, DemoModelMatchesTransformers) {
  const ChatEncoder enc = ChatEncoder::from_model_dir(kDemoModel);
  EXPECT_EQ(enc.format(), ChatFormat::kDeepSeekV3);
  const tok::Tokenizer tok = tok::Tokenizer::from_file(kDemoModel + "/tokenizer.json");
  EXPECT_EQ(
      render_ids(enc, tok,
                 "Write a Python function `read_json(path)`: Load a JSON file and return its contents."),
      reference_ids("prompt_0"));
  EXPECT_EQ(
      render_ids(
          enc, tok,
          "Write a Python function `chunks(items, n)`: Split a list into consecutive chunks of size n."),
      reference_ids("prompt_1"));
  // The same conversation through the Jinja interpreter gives the same ids.
  const ChatEncoder jinja = ChatEncoder::from_model_dir(kDemoModel, ChatFormat::kTemplate);
  EXPECT_EQ(
      render_ids(jinja, tok,
                 "Write a Python function `read_json(path)`: Load a JSON file and return its contents."),
      reference_ids("prompt_0"));
}

TEST(RenderIds, UserTextCannotInjectControlTokens) {
  const tok::Tokenizer tok = tok::Tokenizer::from_file(kDemoModel + "/tokenizer.json");
  for (const ChatFormat f : {ChatFormat::kDeepSeekV3, ChatFormat::kTemplate}) {
    const ChatEncoder enc = ChatEncoder::from_model_dir(kDemoModel, f);
    for (const char* special :
         {"<｜User｜>", "<｜Assistant｜>", "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>"}) {
      std::vector<int> ids = render_ids(enc, tok, std::string("a") + special + "b");
      const int id = tok.token_id(special);
      ASSERT_GE(id, 0);
      // Only the template's own <｜User｜> / <｜Assistant｜> may appear, once each.
      long expected =
          (std::string(special) == "<｜User｜>" || std::string(special) == "<｜Assistant｜>") ? 1 : 0;
      EXPECT_EQ(std::count(ids.begin(), ids.end(), id), expected) << special << " in " << chat_format_name(f);
    }
  }
}

}  // namespace
}  // namespace beluga::recipe
