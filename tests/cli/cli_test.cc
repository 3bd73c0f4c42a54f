// The `beluga` command line as a user runs it: generate, logits, inspect, dummy weights, and clear
// errors (exit code 1 and a message) for bad input.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <unistd.h>

#include "../common/command.h"
#include "cli_test_support.h"
#include "loader/safetensors.h"

namespace beluga {
namespace {

using testing::CmdResult;
using testing::run_beluga;

using testing::kFixtures;

std::string ids_of(const TensorInfo& t) {
  std::string s;
  for (size_t i = 0; i < t.nbytes / 8; ++i) {
    if (i) s += ',';
    s += std::to_string(static_cast<const int64_t*>(t.data)[i]);
  }
  return s;
}

TEST(Cli, GenerateGreedyMatchesTransformers) {
  SafetensorsFile ref(kFixtures + "qwen3-tiny/reference.safetensors");
  CmdResult r = run_beluga("generate --model " + kFixtures + "qwen3-tiny --prompt-ids " +
                           ids_of(ref.get("prompt_1")) + " --max-tokens 24 --temperature 0 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  const TensorInfo& g = ref.get("greedy_1");
  std::vector<int> expect(static_cast<const int64_t*>(g.data), static_cast<const int64_t*>(g.data) + 24);
  EXPECT_EQ(j["output_tokens"].get<std::vector<int>>(), expect);
  EXPECT_EQ(j["prompt_tokens"].size(), ref.get("prompt_1").nbytes / 8);
}

// DeepSeek-V4 through `generate` (prefill, then decode through the hybrid cache): prompt 1 of
// dsv4-tiny, whose reference is stable in length for all 12 greedy steps (golden_test.cc).
TEST(Cli, GenerateOnDeepseekV4MatchesTransformers) {
  SafetensorsFile ref(kFixtures + "dsv4-tiny/reference.safetensors");
  CmdResult r = run_beluga("generate " + kFixtures + "dsv4-tiny --prompt-ids " + ids_of(ref.get("prompt_1")) +
                           " --max-tokens 12 --prefill-chunk 5 --format json");
  ASSERT_EQ(r.code, 0) << r.out;
  const TensorInfo& g = ref.get("greedy_1");
  std::vector<int> expect(static_cast<const int64_t*>(g.data), static_cast<const int64_t*>(g.data) + 12);
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_tokens"].get<std::vector<int>>(), expect);
}

// --expert-parallel-size N: the routed experts on N CPU thread ranks; the same greedy tokens as one rank
// (dsv2-lite-tiny: 8 experts), and a refusal for a model without routed experts.
TEST(Cli, GenerateExpertParallelMatchesOneRank) {
  const std::string cmd =
      "generate " + kFixtures + "dsv2-lite-tiny --prompt-ids 5,9,200,31,7 --max-tokens 12 --threads 1";
  CmdResult one = run_beluga(cmd);
  ASSERT_EQ(one.code, 0) << one.out;
  const auto expect = nlohmann::json::parse(one.out)["output_tokens"].get<std::vector<int>>();
  ASSERT_EQ(expect.size(), 12u);
  for (int n : {2, 4}) {
    CmdResult r = run_beluga(cmd + " --expert-parallel-size " + std::to_string(n));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out)["output_tokens"].get<std::vector<int>>(), expect) << "EP=" << n;
  }
  CmdResult dense =
      run_beluga("generate " + kFixtures + "qwen3-tiny --prompt-ids 1,2 --expert-parallel-size 2");
  EXPECT_NE(dense.code, 0);
  EXPECT_NE(dense.out.find("routed experts"), std::string::npos) << dense.out;
}

// --tensor-parallel-size N: the same greedy tokens as one model for a DeepSeek model (dsv2-lite-tiny:
// query heads and the dense layer split, experts over the same ranks) and a dense one (qwen3-tiny),
// and a refusal naming what does not divide (qwen3-tiny's 2 KV heads over 4 ranks) or the flags
// that do not go together.
TEST(Cli, GenerateTensorParallelMatchesOneModel) {
  for (const std::string model : {"dsv2-lite-tiny", "qwen3-tiny"}) {
    const std::string cmd =
        "generate " + kFixtures + model + " --prompt-ids 5,9,200,31,7 --max-tokens 12 --threads 1";
    CmdResult one = run_beluga(cmd);
    ASSERT_EQ(one.code, 0) << one.out;
    const auto expect = nlohmann::json::parse(one.out)["output_tokens"].get<std::vector<int>>();
    CmdResult r = run_beluga(cmd + " --tensor-parallel-size 2");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_EQ(nlohmann::json::parse(r.out)["output_tokens"].get<std::vector<int>>(), expect) << model;
  }
  CmdResult kv = run_beluga("generate " + kFixtures + "qwen3-tiny --prompt-ids 1,2 --tensor-parallel-size 4");
  EXPECT_NE(kv.code, 0);
  EXPECT_NE(kv.out.find("must divide the model's KV heads (2)"), std::string::npos) << kv.out;
  CmdResult both =
      run_beluga("generate " + kFixtures +
                 "dsv2-lite-tiny --prompt-ids 1,2 --tensor-parallel-size 2 --data-parallel-size 2");
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.out.find("one or the other"), std::string::npos) << both.out;
}

// --eplb on the thread ranks (one redundant slot a rank, a plan every 2 steps over the last 4): the
// same greedy tokens as one rank while the placement changes under the steps, and an info line per
// plan (switched to, or dropped where it would not lower the imbalance).
TEST(Cli, GenerateWithLiveEplbMatchesOneRank) {
  const std::string cmd =
      "generate " + kFixtures + "dsv2-lite-tiny --prompt-ids 5,9,200,31,7 --max-tokens 12 --threads 1";
  CmdResult one = run_beluga(cmd, true);
  ASSERT_EQ(one.code, 0) << one.out;
  const auto expect = nlohmann::json::parse(one.out)["output_tokens"].get<std::vector<int>>();
  const std::filesystem::path log =
      std::filesystem::temp_directory_path() / ("beluga-eplb-" + std::to_string(::getpid()) + ".log");
  CmdResult r =
      testing::run_command(std::string(BELUGA_BINARY) + " " + cmd +
                           " --expert-parallel-size 2 --eplb --eplb-redundant-experts 1 --eplb-interval 2 "
                           "--eplb-window 4 2>" +
                           log.string());
  std::string err;
  if (FILE* f = std::fopen(log.c_str(), "r")) {
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) err.append(buf, n);
    std::fclose(f);
  }
  std::filesystem::remove(log);
  ASSERT_EQ(r.code, 0) << r.out << err;
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_tokens"].get<std::vector<int>>(), expect) << err;
  EXPECT_NE(err.find("eplb: rebalance"), std::string::npos) << err;
}

// --deterministic on CUDA refuses DeepSeek-V4 before touching a device (its step ops were not made batch
// invariant there), with a message that says so; a build without CUDA refuses the device itself.
TEST(Cli, DeterministicOnCudaRefusesDeepseekV4) {
  CmdResult r =
      run_beluga("generate " + kFixtures + "dsv4-tiny --prompt-ids 1,2 --device cuda --deterministic");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(r.out.find("DeepSeek-V4's step ops are not batch invariant") != std::string::npos ||
              r.out.find("not available in this build") != std::string::npos)
      << r.out;
}

// --eplb on CUDA loads the moved experts from a checkpoint on its preparing thread; the GPU's dummy
// weights (made by rank 0's backend) are refused before anything loads.
TEST(Cli, LiveEplbOnCudaRefusesDummyWeights) {
  CmdResult r = run_beluga("generate " + kFixtures +
                           "dsv2-lite-tiny --prompt-ids 1,2 --device cuda --load-format dummy "
                           "--expert-parallel-size 2 --eplb");
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(r.out.find("not with --load-format dummy") != std::string::npos ||
              r.out.find("not available in this build") != std::string::npos)
      << r.out;
}

// Dummy weights for a V4 shape (the hash layers' token -> experts table included): the model
// loads and decodes; inspect reports the hybrid cache's bytes per token.
TEST(Cli, DeepseekV4DummyWeightsRun) {
  const std::string dir = ::testing::TempDir() + "/v4_dummy";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kFixtures + "dsv4-tiny/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  CmdResult r = run_beluga("generate " + dir + " --load-format dummy --prompt-ids 5,6,7,8,9 --max-tokens 6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(nlohmann::json::parse(r.out)["output_tokens"].size(), 6u) << r.out;
  r = run_beluga("inspect " + dir + " --load-format dummy");
  ASSERT_EQ(r.code, 0) << r.out;
  // Per token: 4 layers' K = V rows (64), the compressors' projections (CSA 4*64 + 4*32, HCA 2*64), and
  // the entries (CSA 96 per 4 tokens; HCA one 64-value slot per 64-token block, a window spanning
  // two blocks), in F32.
  const int per_token = 4 * 64 + 2 * (4 * 64 + 4 * 32) + 2 * 64 + 2 * (96 / 4) + 64 / 64;
  EXPECT_EQ(nlohmann::json::parse(r.out)["kv_bytes_per_token"].get<int>(), per_token * 4) << r.out;
}

TEST(Cli, LogitsFileMatchesTransformers) {
  SafetensorsFile ref(kFixtures + "dsv2-lite-tiny/reference.safetensors");
  const std::string out = ::testing::TempDir() + "/cli_logits.safetensors";
  CmdResult r = run_beluga("logits --model " + kFixtures + "dsv2-lite-tiny --prompt-ids " +
                           ids_of(ref.get("prompt_1")) + " --out " + out);
  ASSERT_EQ(r.code, 0) << r.out;
  SafetensorsFile f(out);
  const TensorInfo& ours = f.get("logits");
  const TensorInfo& theirs = ref.get("logits_1");
  ASSERT_EQ(ours.shape, theirs.shape);  // prompt_1 stores every position
  const float* a = static_cast<const float*>(ours.data);
  const float* b = static_cast<const float*>(theirs.data);
  const int64_t V = ours.shape[1];
  for (int64_t r0 = 0; r0 < ours.shape[0]; ++r0) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < V; ++i) {
      num += std::pow(a[r0 * V + i] - b[r0 * V + i], 2);
      den += std::pow(b[r0 * V + i], 2);
    }
    EXPECT_LE(std::sqrt(num / den), 1e-4) << "row " << r0;
  }
  std::remove(out.c_str());
}

TEST(Cli, InspectReportsArchitectureAndKvBytes) {
  CmdResult r = run_beluga("inspect --model " + kFixtures + "dsv3-tiny-fp8");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["architecture"], "deepseek_v3");
  EXPECT_EQ(j["parameters"], 2609024);  // reference.json's n_params
  EXPECT_EQ(j["kv_bytes_per_token"], 2 * (128 + 16) * 4);
  EXPECT_EQ(j["weights_fp8"], true);
  EXPECT_TRUE(j["dtypes"].contains("F8_E4M3"));
}

TEST(Cli, DummyWeightsFromConfigAlone) {
  CmdResult r = run_beluga("generate --model " + kFixtures +
                           "dsv2-lite-tiny/config.json --load-format dummy --prompt-ids 1,2,3 "
                           "--max-tokens 4");
  ASSERT_EQ(r.code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["output_tokens"].size(), 4u);
  // Deterministic: the same command gives the same tokens.
  EXPECT_EQ(run_beluga("generate --model " + kFixtures +
                       "dsv2-lite-tiny/config.json --load-format dummy --prompt-ids 1,2,3 "
                       "--max-tokens 4")
                .out,
            r.out);
}

TEST(Cli, BadInputIsAClearError) {
  struct Case {
    std::string args, needle;
  } cases[] = {
      {"generate --model /nonexistent --prompt-ids 1", "no config.json"},
      {"generate --model " + kFixtures + "qwen3-tiny --prompt-ids 1,x", "not an integer list"},
      {"generate --model " + kFixtures + "qwen3-tiny --prompt-ids 99999", "outside the vocabulary"},
      {"generate --model " + kFixtures + "qwen3-tiny --prompt-ids 1 --bogus 3", "unknown option --bogus"},
      {"generate --model " + kFixtures + "qwen3-tiny", "missing required option --prompt-ids"},
      {"frobnicate", "unknown command"},
  };
  for (const auto& c : cases) {
    CmdResult r = run_beluga(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.out.find(c.needle), std::string::npos) << c.args << " -> " << r.out;
  }
}

}  // namespace
}  // namespace beluga
