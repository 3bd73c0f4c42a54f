// config.json parsing: both rope spellings, the MLA softmax scale, and clear errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "loader/model_config.h"
#include "util/error.h"

namespace beluga {
namespace {

nlohmann::json v2_lite() {
  return nlohmann::json::parse(R"({
    "model_type": "deepseek_v2", "vocab_size": 102400, "hidden_size": 2048, "intermediate_size": 10944,
    "num_hidden_layers": 27, "num_attention_heads": 16, "q_lora_rank": null, "kv_lora_rank": 512,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
    "num_experts_per_tok": 6, "moe_intermediate_size": 1408, "n_shared_experts": 2, "first_k_dense_replace": 1,
    "topk_method": "greedy", "scoring_func": "softmax", "max_position_embeddings": 163840,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}})");
}

TEST(ModelConfig, PublisherRopeSpelling) {
  ModelConfig c = ModelConfig::from_json(v2_lite());
  EXPECT_EQ(c.arch, Arch::kDeepseekV2);
  EXPECT_EQ(c.q_lora_rank, 0);
  EXPECT_EQ(c.rope.type, RopeScaling::Type::kYarn);
  EXPECT_DOUBLE_EQ(c.rope.factor, 40.0);
  EXPECT_EQ(c.kv_entry_dim(), 576);
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_FALSE(c.is_moe_layer(0));
  // (qk_nope + qk_rope)^-0.5 * mscale^2 with mscale = 0.1 * 0.707 * ln 40 + 1 (not 576^-0.5).
  EXPECT_NEAR(c.attention_scale(), 0.114721, 1e-6);
}

TEST(ModelConfig, TransformersV5RopeParameters) {
  nlohmann::json j = v2_lite();
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "yarn"},   {"rope_theta", 50000.0},
                          {"factor", 40},          {"mscale", 1.0},
                          {"mscale_all_dim", 1.0}, {"original_max_position_embeddings", 4096}};
  ModelConfig c = ModelConfig::from_json(j);
  EXPECT_EQ(c.rope.type, RopeScaling::Type::kYarn);
  EXPECT_DOUBLE_EQ(c.rope_theta, 50000.0);
  EXPECT_NEAR(c.attention_scale(), 0.135234, 1e-6);  // DeepSeek-V3's value
}

TEST(ModelConfig, Llama3RopeAndDefaults) {
  ModelConfig c = ModelConfig::from_json(nlohmann::json::parse(R"({
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}, "eos_token_id": [128001, 128009]})"));
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int>{128001, 128009}));
  EXPECT_EQ(c.kv_entry_dim(), 2 * 8 * 128);
  EXPECT_FALSE(c.qkv_bias);
}

TEST(ModelConfig, Qwen2HasBiasQwen3HasQkNorm) {
  auto base = nlohmann::json::parse(R"({"vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2})");
  base["model_type"] = "qwen2";
  EXPECT_TRUE(ModelConfig::from_json(base).qkv_bias);
  base["model_type"] = "qwen3";
  base["head_dim"] = 32;
  ModelConfig q3 = ModelConfig::from_json(base);
  EXPECT_TRUE(q3.qk_norm);
  EXPECT_EQ(q3.head_dim, 32);
}

TEST(ModelConfig, ErrorsNameTheProblem) {
  auto j = v2_lite();
  j["model_type"] = "mamba";
  EXPECT_THROW(
      {
        try {
          ModelConfig::from_json(j);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("unsupported model_type 'mamba'"), std::string::npos);
          throw;
        }
      },
      Error);
  j = v2_lite();
  j.erase("kv_lora_rank");
  EXPECT_THROW(ModelConfig::from_json(j), Error);
  j = v2_lite();
  j["hidden_size"] = "big";
  EXPECT_THROW(ModelConfig::from_json(j), Error);
  j = v2_lite();
  j["quantization_config"] = {{"quant_method", "gptq"}};
  EXPECT_THROW(ModelConfig::from_json(j), Error);
}

// Found by tests/fuzz/fuzz_model_config: a number outside int's range was cast (undefined behaviour).
TEST(ModelConfig, OutOfRangeNumbersAreAnError) {
  for (const char* field : {"num_hidden_layers", "bos_token_id", "max_position_embeddings"}) {
    nlohmann::json j = v2_lite();
    j[field] = 3.4e69;
    EXPECT_THROW(ModelConfig::from_json(j), Error) << field;
  }
  nlohmann::json j = v2_lite();
  j["eos_token_id"] = nlohmann::json::array({1, 1e30});
  EXPECT_THROW(ModelConfig::from_json(j), Error);
}

}  // namespace
}  // namespace beluga
