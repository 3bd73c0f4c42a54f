// `beluga serve` on a DeepSeek-V4 checkpoint (tests/fixtures/dsv4-tiny, CPU) with the byte-level test
// tokenizer (tests/fixtures/dsv4-byte-tokenizer): the server picks the DeepSeek-V4 chat format from
// the model's config, a greedy completion over token ids decodes to transformers' greedy tokens, and a
// chat request's prompt is the V4 encoder's (its token count, not V3's).
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "../common/http_client.h"
#include "../common/serve_process.h"
#include "loader/safetensors.h"
#include "recipe/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace beluga {
namespace {

using Json = nlohmann::json;
const std::string kDir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/";

// `beluga serve` on a checkpoint of tests/fixtures with `extra` flags.
testing::ChildProcess serve(const std::string& model, const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {"--max-model-len", "1024"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return testing::beluga_serve(testing::serve_flags(kDir + model, 16, flags));
}

// POST `body` to `path`, with a minute for the reply.
server::testing::HttpReply post(int port, const std::string& path, const Json& body) {
  return server::testing::http_request(port, server::testing::Verb::post, path, body.dump(), {},
                                       std::chrono::seconds(60));
}

std::vector<int> ids(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  const auto* p = static_cast<const int64_t*>(t.data);
  return std::vector<int>(p, p + t.nbytes / 8);
}

TEST(DeepseekV4Serve, CompletionsAndChatOnTheHybridCache) {
  const std::string tok_dir = kDir + "dsv4-byte-tokenizer";
  const testing::ChildProcess srv = serve("dsv4-tiny", {"--tokenizer", tok_dir});
  ASSERT_GT(srv.port(), 0) << srv.log();
  EXPECT_NE(srv.log().find("chat format deepseek-v4,"), std::string::npos) << srv.log();
  const tok::Tokenizer tokenizer = tok::Tokenizer::from_file(tok_dir + "/tokenizer.json");

  // Greedy over token ids: the text of transformers' greedy tokens (golden_test says for how many
  // steps each prompt's reference is stable: all 12 for prompt 1, 4 for prompt 3). Prompt 3 (300
  // tokens, through the HCA branch) runs twice; the second run takes its 4 full blocks (256 tokens)
  // from the prefix cache and continues from them to the same tokens.
  SafetensorsFile ref(kDir + "dsv4-tiny/reference.safetensors");
  for (const auto& [name, steps, runs] : {std::tuple{std::string("1"), size_t(12), 1}, {"3", size_t(4), 2}}) {
    const std::vector<int> prompt = ids(ref, "prompt_" + name), all = ids(ref, "greedy_" + name);
    const std::vector<int> greedy(all.begin(), all.begin() + long(steps));
    for (int run = 0; run < runs; ++run) {
      const auto r =
          post(srv.port(), "/v1/completions",
               Json{{"prompt", prompt}, {"max_tokens", steps}, {"temperature", 0}, {"ignore_eos", true}});
      ASSERT_EQ(r.status, 200) << r.body;
      const Json j = Json::parse(r.body);
      EXPECT_EQ(j["choices"][0]["text"].get<std::string>(), tokenizer.decode(greedy))
          << "prompt " << name << " run " << run;
      EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(), prompt.size());
      EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), run == 0 ? 0 : 256)
          << r.body;
    }
  }

  // Chat: the prompt is the DeepSeek-V4 encoding of the conversation (its length differs from V3's).
  recipe::Conversation conv;
  recipe::Message m;
  m.content.push_back({recipe::ContentPart::Kind::kText, "Hello there, V4!", ""});
  conv.messages.push_back(m);
  const size_t v4 = recipe::ChatEncoder(recipe::ChatFormat::kDeepSeekV4).encode(conv).ids(tokenizer).size();
  const size_t v3 = recipe::ChatEncoder(recipe::ChatFormat::kDeepSeekV3).encode(conv).ids(tokenizer).size();
  ASSERT_NE(v4, v3);
  const auto r =
      post(srv.port(), "/v1/chat/completions",
           Json{{"messages", Json::array({Json{{"role", "user"}, {"content", "Hello there, V4!"}}})},
                {"max_tokens", 6},
                {"temperature", 0}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Json::parse(r.body);
  EXPECT_EQ(j["usage"]["prompt_tokens"].get<size_t>(), v4);
  EXPECT_GE(j["usage"]["completion_tokens"].get<int>(), 1);
  EXPECT_TRUE(j["choices"][0]["message"].contains("content")) << r.body;
}

}  // namespace
}  // namespace beluga
