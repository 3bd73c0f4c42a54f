// DeepSeek-V4 config.json in both spellings: the publisher's (compress_ratios, num_hash_layers,
// qk_rope_head_dim, rope_scaling) and transformers' (layer_types, mlp_layer_types, compress_rates,
// rope_parameters with main / compress) give the same layer schedule and ropes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/model.h"
#include "util/error.h"

namespace beluga {
namespace {

nlohmann::json common() {
  return nlohmann::json::parse(R"({
    "model_type": "deepseek_v4", "vocab_size": 1024, "hidden_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "q_lora_rank": 64,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 1,
    "o_groups": 2, "o_lora_rank": 32, "index_n_heads": 2, "index_head_dim": 32, "index_topk": 4,
    "sliding_window": 16, "swiglu_limit": 10.0, "rope_theta": 10000.0, "compress_rope_theta": 160000.0,
    "max_position_embeddings": 65536, "num_nextn_predict_layers": 1})");
}

nlohmann::json publisher() {
  nlohmann::json j = common();
  j["compress_ratios"] = {0, 4, 128, 4, 0};  // the trailing entry is the MTP layer's
  j["num_hash_layers"] = 1;
  j["qk_rope_head_dim"] = 16;
  j["rope_scaling"] = {{"type", "yarn"},
                       {"factor", 16.0},
                       {"original_max_position_embeddings", 4096},
                       {"beta_fast", 32},
                       {"beta_slow", 1}};
  return j;
}

nlohmann::json transformers() {
  nlohmann::json j = common();
  j["layer_types"] = {"sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                      "compressed_sparse_attention"};
  j["mlp_layer_types"] = {"hash_moe", "moe", "moe", "moe"};
  j["compress_rates"] = {{"compressed_sparse_attention", 4}, {"heavily_compressed_attention", 128}};
  j["partial_rotary_factor"] = 0.25;
  j["rope_parameters"] = nlohmann::json::parse(R"({
    "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "factor": 16.0, "attention_factor": 1.0,
                 "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1,
                 "partial_rotary_factor": 0.25}})");
  return j;
}

TEST(DeepseekV4Config, BothSpellingsGiveTheSameSchedule) {
  for (const auto& j : {publisher(), transformers()}) {
    ModelConfig c = ModelConfig::from_json(j);
    EXPECT_EQ(c.arch, Arch::kDeepseekV4);
    const V4Config& v = c.v4;
    EXPECT_EQ(v.attention,
              (std::vector<V4Attention>{V4Attention::kSliding, V4Attention::kCompressedSparse,
                                        V4Attention::kHeavilyCompressed, V4Attention::kCompressedSparse}));
    EXPECT_EQ(v.compress_rate, (std::vector<int>{0, 4, 128, 4}));
    EXPECT_EQ(v.hash_moe, (std::vector<bool>{true, false, false, false}));
    EXPECT_EQ(v.rope_dim, 16);
    EXPECT_EQ(c.rope.type, RopeScaling::Type::kNone);
    EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
    EXPECT_EQ(v.compress_rope.type, RopeScaling::Type::kYarn);
    EXPECT_DOUBLE_EQ(v.compress_rope.factor, 16.0);
    EXPECT_DOUBLE_EQ(v.compress_rope.attention_factor, 1.0);  // cos/sin unscaled, as transformers forces
    EXPECT_DOUBLE_EQ(v.compress_rope_theta, 160000.0);
    EXPECT_EQ(c.scoring_func, ModelConfig::ScoringFunc::kSqrtSoftplus);
    EXPECT_EQ(c.intermediate_size, 64);
    EXPECT_DOUBLE_EQ(c.attention_scale(), 1.0 / 8.0);
  }
}

TEST(DeepseekV4Config, TransformersDefaultScheduleWithoutLayerKeys) {
  nlohmann::json j = common();
  j["num_hidden_layers"] = 5;
  ModelConfig c = ModelConfig::from_json(j);
  // Two heavily-compressed layers, then compressed-sparse / heavily alternating; three hash layers.
  EXPECT_EQ(c.v4.compress_rate, (std::vector<int>{128, 128, 128, 4, 128}));
  EXPECT_EQ(c.v4.hash_moe, (std::vector<bool>{true, true, true, false, false}));
}

TEST(DeepseekV4Config, ClearErrors) {
  nlohmann::json j = publisher();
  j["compress_ratios"] = {0, 4, 16, 4};
  EXPECT_THROW(ModelConfig::from_json(j), Error);
  j = transformers();
  j["layer_types"][1] = "full_attention";
  EXPECT_THROW(ModelConfig::from_json(j), Error);
  j = transformers();
  j["num_key_value_heads"] = 2;
  EXPECT_THROW(ModelConfig::from_json(j), Error);
  j = transformers();
  j["layer_types"] = {"sliding_attention"};
  EXPECT_THROW(ModelConfig::from_json(j), Error);
}

// FP8 checkpoints load (tests/golden: dsv4-tiny-fp8), but the grouped output projection is split by
// rows into its groups, so a group must start on a scale block: o_lora_rank 32 with 128-row blocks is
// refused before anything loads, naming the two numbers.
TEST(DeepseekV4Config, Fp8OutputGroupsMustStartOnScaleBlocks) {
  nlohmann::json j = transformers();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 128}}};
  const ModelConfig c = ModelConfig::from_json(j);
  CpuOps ops({1});
  DummyWeights w;
  try {
    load_model(c, w, ops, 64);
    FAIL() << "an FP8 deepseek_v4 checkpoint with o_lora_rank 32 and 128-row blocks loaded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("o_lora_rank (32)"), std::string::npos) << m;
    EXPECT_NE(m.find("(128)"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace beluga
