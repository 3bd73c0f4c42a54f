// ModelConfig: the typed form of a Hugging Face config.json for the architectures Beluga runs.
// Accepts the publisher's spelling (`rope_scaling` with `type`) and transformers v5's
// (`rope_parameters` with `rope_type` and `rope_theta` inside). DeepSeek-V4 takes both its
// publisher's keys (`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`, `rope_scaling`) and
// transformers' (`layer_types`, `mlp_layer_types`, `compress_rates`, `rope_parameters` main/compress).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace beluga {

enum class Arch { kDeepseekV2, kDeepseekV3, kDeepseekV4, kLlama, kQwen2, kQwen3 };

struct RopeScaling {
  enum class Type { kNone, kLinear, kYarn, kLlama3 } type = Type::kNone;
  double factor = 1.0;
  int original_max_position_embeddings = 0;
  // yarn
  double beta_fast = 32.0, beta_slow = 1.0, mscale = 1.0, mscale_all_dim = 0.0;
  // llama3
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  // > 0: the cos/sin magnitude as given (transformers' `attention_factor`); else derived from mscale.
  double attention_factor = 0.0;
};

// DeepSeek-V4's per-layer attention: a sliding window always, plus compressed entries (one per `rate`
// tokens) that every query sees (HCA) or that a lightning indexer picks top-k of (CSA).
enum class V4Attention { kSliding, kCompressedSparse, kHeavilyCompressed };

struct V4Config {
  std::vector<V4Attention> attention;  // per layer
  std::vector<int> compress_rate;      // per layer; 0 for sliding layers
  std::vector<bool> hash_moe;          // per layer: experts from tid2eid[token] (else learned top-k)
  int rope_dim = 0;                    // trailing slice of each head that rotates
  double compress_rope_theta = 160000.0;
  RopeScaling compress_rope;  // the compressed branches' rope (yarn); the main rope is plain
  int sliding_window = 128;
  int o_groups = 1, o_lora_rank = 0;
  int index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  int hc_mult = 1, hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double swiglu_limit = 0.0;  // 0: no clamp
};

struct ModelConfig {
  Arch arch = Arch::kLlama;
  std::string model_type;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;  // dense models
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // qwen2, or llama with attention_bias
  bool qk_norm = false;   // qwen3
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;

  // MLA (DeepSeek)
  int q_lora_rank = 0;  // 0: plain q_proj (V2-Lite)
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;

  // MoE (DeepSeek)
  int n_routed_experts = 0;
  int n_shared_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int first_k_dense_replace = 0;
  int moe_layer_freq = 1;
  int n_group = 1;
  int topk_group = 1;
  enum class TopkMethod { kGreedy, kGroupLimitedGreedy, kNoauxTc } topk_method = TopkMethod::kGreedy;
  enum class ScoringFunc { kSoftmax, kSigmoid, kSqrtSoftplus } scoring_func = ScoringFunc::kSoftmax;
  bool norm_topk_prob = false;
  double routed_scaling_factor = 1.0;
  int num_nextn_predict_layers = 0;

  // FP8 block-scaled weights
  bool fp8 = false;
  int fp8_block_n = 128, fp8_block_k = 128;

  V4Config v4;  // deepseek_v4 only (head_dim, q_lora_rank and the MoE fields above are shared)

  bool is_mla() const { return arch == Arch::kDeepseekV2 || arch == Arch::kDeepseekV3; }
  bool is_moe_layer(int layer) const {
    return n_routed_experts > 0 && layer >= first_k_dense_replace && layer % moe_layer_freq == 0;
  }
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Values cached per token per layer: MLA latent + rope key, or K and V of every KV head.
  // DeepSeek-V4: the sliding window's K = V row; its compressed layers keep more per token and per
  // compressed entry (Model::kv_layout in deepseek_v4.cc).
  int kv_entry_dim() const {
    if (arch == Arch::kDeepseekV4) return head_dim;
    return is_mla() ? kv_lora_rank + qk_rope_head_dim : 2 * num_kv_heads * head_dim;
  }
  double attention_scale() const;  // includes the yarn mscale² for MLA

  static ModelConfig from_json(const nlohmann::json& j);
  static ModelConfig from_file(const std::string& path);
};

const char* arch_name(Arch a);

}  // namespace beluga
