// `beluga serve --tensor-parallel-size 2` on a dense checkpoint (tests/fixtures/qwen3-tiny, CPU thread
// ranks) with the byte-level test tokenizer: the /metrics page counts the ranks and one rank's
// cache, and when rank 1 fails (BELUGA_TEST_FAIL_RANK) the request that meets it gets a 503 naming
// the tensor-parallel rank and the instance restarts over the one rank left, whose greedy text and
// logprobs are the split model's (tests/golden checks the split against transformers).
#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../common/http_client.h"
#include "../common/serve_process.h"

namespace beluga {
namespace {

using Json = nlohmann::json;
using server::testing::metric_value;
const std::string kDir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/";

server::testing::HttpReply post(int port, const Json& body) {
  return server::testing::http_request(port, server::testing::Verb::post, "/v1/completions", body.dump(), {},
                                       std::chrono::seconds(60));
}
server::testing::HttpReply get(int port, const std::string& path) {
  return server::testing::http_request(port, server::testing::Verb::get, path, "", {},
                                       std::chrono::seconds(10));
}

TEST(TensorParallelServe, GreedyTextMetricsAndARestartAfterARankFails) {
  const std::string tok_dir = kDir + "dsv4-byte-tokenizer";
  testing::ChildOptions options;
  options.env = {"BELUGA_TEST_FAIL_RANK=1:6"};
  testing::ChildProcess srv =
      testing::beluga_serve(testing::serve_flags(kDir + "qwen3-tiny", 16,
                                                 {"--tokenizer", tok_dir, "--chat-format", "deepseek-v3",
                                                  "--max-model-len", "1024", "--tensor-parallel-size", "2"}),
                            options);
  ASSERT_GT(srv.port(), 0) << srv.log();
  const int port = srv.port();
  const std::string page = get(port, "/metrics").body;
  EXPECT_EQ(metric_value(page, "beluga_expert_parallel_ranks"), 2) << page;
  // 16 MiB a rank, of one rank's half of the KV heads: twice the blocks of one model's cache
  // (2 layers x 2 x 1 KV head x 32 x 4 bytes = 512 bytes a token, 32 KiB a block).
  EXPECT_EQ(metric_value(page, "beluga_kv_blocks_total"), 16 * 1024 / 32) << page;

  // Steps 1-3: a prefill and two decode steps over both ranks. After the restart one model serves
  // the same request: the same text and, within float rounding, the same logprobs.
  const std::string prompt = "Tensor parallel ranks split the attention heads and the MLP of a dense model.";
  const Json greedy{
      {"prompt", prompt}, {"max_tokens", 3}, {"temperature", 0}, {"ignore_eos", true}, {"logprobs", 3}};
  const auto before = post(port, greedy);
  ASSERT_EQ(before.status, 200) << before.body;
  const Json first = Json::parse(before.body)["choices"][0];
  // This one meets the failure at step 6.
  const auto hit = post(port, Json{{"prompt", prompt}, {"max_tokens", 30}, {"ignore_eos", true}});
  EXPECT_EQ(hit.status, 503) << hit.body;
  EXPECT_NE(hit.body.find("tensor-parallel rank 1 failed"), std::string::npos) << hit.body;
  ASSERT_EQ(server::testing::wait_for_health(port, 60), 200) << srv.log();
  const std::string after_page = get(port, "/metrics").body;
  EXPECT_EQ(metric_value(after_page, "beluga_expert_parallel_ranks"), 1) << after_page;
  EXPECT_EQ(metric_value(after_page, "beluga_engine_restarts_total"), 1) << after_page;
  EXPECT_EQ(metric_value(after_page, "beluga_kv_blocks_total"), 16 * 1024 / 64) << "one model's cache";
  const auto after = post(port, greedy);
  ASSERT_EQ(after.status, 200) << after.body;
  const Json again = Json::parse(after.body)["choices"][0];
  EXPECT_EQ(again["text"], first["text"]);
  const Json& lp0 = first["logprobs"]["token_logprobs"];
  const Json& lp1 = again["logprobs"]["token_logprobs"];
  ASSERT_EQ(lp0.size(), 3u) << before.body;
  ASSERT_EQ(lp1.size(), 3u) << after.body;
  for (size_t k = 0; k < 3; ++k)
    EXPECT_NEAR(lp1[k].get<double>(), lp0[k].get<double>(), 1e-4) << "token " << k;
  EXPECT_TRUE(srv.alive());
  const std::string log = srv.log();
  EXPECT_NE(log.find("tensor-parallel rank 1 of 2 failed (injected failure of rank 1 at its step 6); "
                     "restarting over 1 rank"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("serving again over 1 tensor-parallel rank (restart 1"), std::string::npos) << log;
}

}  // namespace
}  // namespace beluga
