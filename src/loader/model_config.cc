#include "loader/model_config.h"

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <type_traits>

#include "util/error.h"
#include "util/file.h"

namespace beluga {

namespace {

using nlohmann::json;

// A field as T; a number outside T's range (1e70 for an int) is an error, not a cast that
// overflows (found by tests/fuzz/fuzz_model_config).
template <typename T>
T typed(const json& v, const char* key) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (v.is_number()) {
      const double x = v.get<double>();
      BELUGA_CHECK(x >= double(std::numeric_limits<T>::min()) && x <= double(std::numeric_limits<T>::max()),
                   "config.json: field '", key, "' is out of range (", v.dump(), ")");
    }
  }
  try {
    return v.get<T>();
  } catch (const std::exception&) {
    fail("config.json: field '", key, "' has the wrong type (", v.type_name(), ")");
  }
}

template <typename T>
T get_or(const json& j, const char* key, T def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  return typed<T>(*it, key);
}

template <typename T>
T require(const json& j, const char* key) {
  auto it = j.find(key);
  BELUGA_CHECK(it != j.end() && !it->is_null(), "config.json: missing field '", key, "'");
  return typed<T>(*it, key);
}

double yarn_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// One rope dict (either spelling): its scaling, and its `rope_theta` into *theta when present.
RopeScaling parse_rope_dict(const json& rs, double* theta) {
  RopeScaling r;
  *theta = get_or<double>(rs, "rope_theta", *theta);
  std::string type = get_or<std::string>(rs, "rope_type", get_or<std::string>(rs, "type", "default"));
  if (type == "default") return r;
  r.factor = get_or<double>(rs, "factor", 1.0);
  r.original_max_position_embeddings = get_or<int>(rs, "original_max_position_embeddings", 0);
  r.attention_factor = get_or<double>(rs, "attention_factor", 0.0);
  if (type == "yarn") {
    r.type = RopeScaling::Type::kYarn;
    r.beta_fast = get_or<double>(rs, "beta_fast", 32.0);
    r.beta_slow = get_or<double>(rs, "beta_slow", 1.0);
    r.mscale = get_or<double>(rs, "mscale", 1.0);
    r.mscale_all_dim = get_or<double>(rs, "mscale_all_dim", 0.0);
  } else if (type == "llama3") {
    r.type = RopeScaling::Type::kLlama3;
    r.low_freq_factor = get_or<double>(rs, "low_freq_factor", 1.0);
    r.high_freq_factor = get_or<double>(rs, "high_freq_factor", 4.0);
  } else if (type == "linear") {
    r.type = RopeScaling::Type::kLinear;
  } else {
    fail("config.json: unsupported rope scaling type '", type, "'");
  }
  return r;
}

RopeScaling parse_rope(const json& j, double* theta) {
  const json* rs = nullptr;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object())
    rs = &j["rope_parameters"];
  else if (j.contains("rope_scaling") && j["rope_scaling"].is_object())
    rs = &j["rope_scaling"];
  if (!rs) return {};
  return parse_rope_dict(*rs, theta);
}

// DeepSeek-V4's own fields, in either spelling (see model_config.h).
void parse_v4(const json& j, ModelConfig& c) {
  V4Config& v = c.v4;
  const int n = c.num_layers;
  c.head_dim = require<int>(j, "head_dim");
  c.q_lora_rank = require<int>(j, "q_lora_rank");
  BELUGA_CHECK(c.num_kv_heads == 1, "deepseek_v4: num_key_value_heads must be 1 (shared-KV MQA), got ",
               c.num_kv_heads);
  // Compression rates per attention type; transformers' dict, or the publisher's per-layer ints.
  int csa_rate = 4, hca_rate = 128;
  if (j.contains("compress_rates") && j["compress_rates"].is_object()) {
    csa_rate = get_or<int>(j["compress_rates"], "compressed_sparse_attention", csa_rate);
    hca_rate = get_or<int>(j["compress_rates"], "heavily_compressed_attention", hca_rate);
  }
  csa_rate = get_or<int>(j, "compress_rate_csa", csa_rate);
  hca_rate = get_or<int>(j, "compress_rate_hca", hca_rate);
  BELUGA_CHECK(csa_rate > 0 && hca_rate > 0, "deepseek_v4: compression rates must be positive");
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    for (const auto& t : j["layer_types"]) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      if (s == "sliding_attention")
        v.attention.push_back(V4Attention::kSliding);
      else if (s == "compressed_sparse_attention")
        v.attention.push_back(V4Attention::kCompressedSparse);
      else if (s == "heavily_compressed_attention")
        v.attention.push_back(V4Attention::kHeavilyCompressed);
      else
        fail("config.json: unsupported deepseek_v4 layer type ", t.dump());
    }
  } else if (j.contains("compress_ratios") && j["compress_ratios"].is_array()) {
    // The publisher's spelling: 0 sliding, 4 compressed-sparse, 128 heavily-compressed.
    for (const auto& r : j["compress_ratios"]) {
      const int x = r.is_number_integer() ? r.get<int>() : -1;
      if (x == 0)
        v.attention.push_back(V4Attention::kSliding);
      else if (x == 4)
        v.attention.push_back(V4Attention::kCompressedSparse);
      else if (x == 128)
        v.attention.push_back(V4Attention::kHeavilyCompressed);
      else
        fail("config.json: unsupported deepseek_v4 compress ratio ", r.dump(), " (supported: 0, 4, 128)");
    }
  } else {
    // transformers' default: two heavily-compressed layers, then compressed-sparse / heavily alternating.
    for (int l = 0; l < n; ++l)
      v.attention.push_back(l < 2 || (l - 2) % 2 == 0 ? V4Attention::kHeavilyCompressed
                                                      : V4Attention::kCompressedSparse);
  }
  // Layers past num_hidden_layers (MTP) are not part of the forward.
  BELUGA_CHECK(int(v.attention.size()) >= n, "config.json: deepseek_v4 has ", v.attention.size(),
               " attention layer types for ", n, " layers");
  v.attention.resize(size_t(n));
  for (V4Attention a : v.attention)
    v.compress_rate.push_back(a == V4Attention::kSliding            ? 0
                              : a == V4Attention::kCompressedSparse ? csa_rate
                                                                    : hca_rate);
  if (j.contains("mlp_layer_types") && j["mlp_layer_types"].is_array()) {
    for (const auto& t : j["mlp_layer_types"]) {
      const std::string s = t.is_string() ? t.get<std::string>() : "";
      BELUGA_CHECK(s == "hash_moe" || s == "moe", "config.json: unsupported deepseek_v4 mlp layer type ",
                   t.dump());
      v.hash_moe.push_back(s == "hash_moe");
    }
    BELUGA_CHECK(int(v.hash_moe.size()) >= n, "config.json: deepseek_v4 mlp_layer_types is too short");
    v.hash_moe.resize(size_t(n));
  } else {
    const int hash = get_or<int>(j, "num_hash_layers", 3);
    for (int l = 0; l < n; ++l) v.hash_moe.push_back(l < hash);
  }
  // Rotary slice: partial_rotary_factor, else the publisher's qk_rope_head_dim, else 64/512.
  double prf = get_or<double>(j, "partial_rotary_factor", 0.0);
  if (prf <= 0) {
    const int qk_rope = get_or<int>(j, "qk_rope_head_dim", 0);
    prf = qk_rope > 0 ? double(qk_rope) / c.head_dim : 64.0 / 512.0;
  }
  v.rope_dim = int(c.head_dim * prf);
  c.qk_rope_head_dim = v.rope_dim;
  BELUGA_CHECK(v.rope_dim > 0 && v.rope_dim % 2 == 0 && v.rope_dim <= c.head_dim,
               "config.json: deepseek_v4 rotary dimension ", v.rope_dim, " must be even and within head_dim");
  // Ropes: the sliding layers' plain one (rope_theta) and the compressed branches' (yarn on
  // compress_rope_theta; its cos/sin unscaled, attention_factor 1, as transformers forces).
  v.compress_rope_theta = get_or<double>(j, "compress_rope_theta", 160000.0);
  const json* rp =
      j.contains("rope_parameters") && j["rope_parameters"].is_object() ? &j["rope_parameters"] : nullptr;
  c.rope = {};
  if (rp && rp->contains("main") && (*rp)["main"].is_object() && rp->contains("compress") &&
      (*rp)["compress"].is_object()) {
    c.rope = parse_rope_dict((*rp)["main"], &c.rope_theta);
    v.compress_rope = parse_rope_dict((*rp)["compress"], &v.compress_rope_theta);
  } else {
    const json* rs =
        rp ? rp
           : (j.contains("rope_scaling") && j["rope_scaling"].is_object() ? &j["rope_scaling"] : nullptr);
    double ignored = 0;
    if (rs) v.compress_rope = parse_rope_dict(*rs, &ignored);
    v.compress_rope.attention_factor = 1.0;
  }
  v.sliding_window = get_or<int>(j, "sliding_window", 128);
  v.o_groups = get_or<int>(j, "o_groups", 8);
  v.o_lora_rank = get_or<int>(j, "o_lora_rank", 1024);
  v.index_n_heads = get_or<int>(j, "index_n_heads", 64);
  v.index_head_dim = get_or<int>(j, "index_head_dim", 128);
  v.index_topk = get_or<int>(j, "index_topk", 512);
  v.hc_mult = get_or<int>(j, "hc_mult", 4);
  v.hc_sinkhorn_iters = get_or<int>(j, "hc_sinkhorn_iters", 20);
  v.hc_eps = get_or<double>(j, "hc_eps", 1e-6);
  v.swiglu_limit = get_or<double>(j, "swiglu_limit", 0.0);
  BELUGA_CHECK(v.sliding_window > 0 && v.o_groups > 0 && c.num_heads % v.o_groups == 0 && v.o_lora_rank > 0 &&
                   v.hc_mult > 0 && v.hc_sinkhorn_iters > 0,
               "config.json: bad deepseek_v4 dimensions");
  for (V4Attention a : v.attention)
    if (a == V4Attention::kCompressedSparse)
      BELUGA_CHECK(v.index_n_heads > 0 && v.index_head_dim >= v.rope_dim && v.index_topk > 0,
                   "config.json: bad deepseek_v4 indexer dimensions");

  c.n_routed_experts = require<int>(j, "n_routed_experts");
  c.n_shared_experts = get_or<int>(j, "n_shared_experts", 1);
  c.num_experts_per_tok = require<int>(j, "num_experts_per_tok");
  c.moe_intermediate_size = require<int>(j, "moe_intermediate_size");
  c.intermediate_size = c.moe_intermediate_size;
  const std::string sf = get_or<std::string>(j, "scoring_func", "sqrtsoftplus");
  if (sf == "sqrtsoftplus")
    c.scoring_func = ModelConfig::ScoringFunc::kSqrtSoftplus;
  else if (sf == "softmax")
    c.scoring_func = ModelConfig::ScoringFunc::kSoftmax;
  else if (sf == "sigmoid")
    c.scoring_func = ModelConfig::ScoringFunc::kSigmoid;
  else
    fail("config.json: unsupported scoring_func '", sf, "'");
  c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", true);
  c.routed_scaling_factor = get_or<double>(j, "routed_scaling_factor", 1.5);
  c.num_nextn_predict_layers = get_or<int>(j, "num_nextn_predict_layers", 0);
  BELUGA_CHECK(
      c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts && c.moe_intermediate_size > 0,
      "config.json: bad MoE dimensions");
}

}  // namespace

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::kDeepseekV2:
      return "deepseek_v2";
    case Arch::kDeepseekV3:
      return "deepseek_v3";
    case Arch::kDeepseekV4:
      return "deepseek_v4";
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
  }
  return "?";
}

double ModelConfig::attention_scale() const {
  if (arch == Arch::kDeepseekV4) return 1.0 / std::sqrt(double(head_dim));
  if (!is_mla()) return 1.0 / std::sqrt(double(head_dim));
  double s = 1.0 / std::sqrt(double(qk_head_dim()));
  if (rope.type == RopeScaling::Type::kYarn && rope.mscale_all_dim > 0) {
    double m = yarn_mscale(rope.factor, rope.mscale_all_dim);
    s *= m * m;
  }
  return s;
}

ModelConfig ModelConfig::from_json(const json& j) {
  BELUGA_CHECK(j.is_object(), "config.json is not a JSON object");
  ModelConfig c;
  c.model_type = require<std::string>(j, "model_type");
  if (c.model_type == "deepseek_v2")
    c.arch = Arch::kDeepseekV2;
  else if (c.model_type == "deepseek_v3")
    c.arch = Arch::kDeepseekV3;
  else if (c.model_type == "deepseek_v4")
    c.arch = Arch::kDeepseekV4;
  else if (c.model_type == "llama")
    c.arch = Arch::kLlama;
  else if (c.model_type == "qwen2")
    c.arch = Arch::kQwen2;
  else if (c.model_type == "qwen3")
    c.arch = Arch::kQwen3;
  else
    fail("unsupported model_type '", c.model_type,
         "' (supported: deepseek_v2, deepseek_v3, deepseek_v4, llama, qwen2, qwen3)");

  c.vocab_size = require<int>(j, "vocab_size");
  c.hidden_size = require<int>(j, "hidden_size");
  if (c.arch != Arch::kDeepseekV4) c.intermediate_size = require<int>(j, "intermediate_size");
  c.num_layers = require<int>(j, "num_hidden_layers");
  c.num_heads = require<int>(j, "num_attention_heads");
  c.num_kv_heads = get_or<int>(j, "num_key_value_heads", c.num_heads);
  c.rms_norm_eps = get_or<double>(j, "rms_norm_eps", 1e-6);
  c.rope_theta = get_or<double>(j, "rope_theta", 10000.0);
  c.rope = parse_rope(j, &c.rope_theta);
  c.max_position_embeddings = get_or<int>(j, "max_position_embeddings", 4096);
  c.tie_word_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
  c.bos_token_id = get_or<int>(j, "bos_token_id", -1);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
    for (const auto& id : j["eos_token_id"]) c.eos_token_ids.push_back(typed<int>(id, "eos_token_id"));
  } else if (j.contains("eos_token_id") && j["eos_token_id"].is_number_integer()) {
    c.eos_token_ids = {typed<int>(j["eos_token_id"], "eos_token_id")};
  }
  BELUGA_CHECK(
      c.vocab_size > 0 && c.hidden_size > 0 && c.num_layers > 0 && c.num_heads > 0 && c.num_kv_heads > 0,
      "config.json: sizes must be positive");

  if (c.arch == Arch::kDeepseekV4) {
    parse_v4(j, c);
  } else if (c.is_mla()) {
    c.q_lora_rank = get_or<int>(j, "q_lora_rank", 0);
    c.kv_lora_rank = require<int>(j, "kv_lora_rank");
    c.qk_nope_head_dim = require<int>(j, "qk_nope_head_dim");
    c.qk_rope_head_dim = require<int>(j, "qk_rope_head_dim");
    c.v_head_dim = require<int>(j, "v_head_dim");
    c.n_routed_experts = get_or<int>(j, "n_routed_experts", 0);
    c.n_shared_experts = get_or<int>(j, "n_shared_experts", 0);
    c.num_experts_per_tok = get_or<int>(j, "num_experts_per_tok", 0);
    c.moe_intermediate_size = get_or<int>(j, "moe_intermediate_size", 0);
    c.first_k_dense_replace = get_or<int>(j, "first_k_dense_replace", 0);
    c.moe_layer_freq = std::max(1, get_or<int>(j, "moe_layer_freq", 1));
    c.n_group = std::max(1, get_or<int>(j, "n_group", 1));
    c.topk_group = std::max(1, get_or<int>(j, "topk_group", 1));
    std::string tm =
        get_or<std::string>(j, "topk_method", c.arch == Arch::kDeepseekV3 ? "noaux_tc" : "greedy");
    if (tm == "greedy")
      c.topk_method = TopkMethod::kGreedy;
    else if (tm == "group_limited_greedy")
      c.topk_method = TopkMethod::kGroupLimitedGreedy;
    else if (tm == "noaux_tc")
      c.topk_method = TopkMethod::kNoauxTc;
    else
      fail("config.json: unsupported topk_method '", tm, "'");
    std::string sf =
        get_or<std::string>(j, "scoring_func", c.arch == Arch::kDeepseekV3 ? "sigmoid" : "softmax");
    if (sf == "softmax")
      c.scoring_func = ScoringFunc::kSoftmax;
    else if (sf == "sigmoid")
      c.scoring_func = ScoringFunc::kSigmoid;
    else
      fail("config.json: unsupported scoring_func '", sf, "'");
    c.norm_topk_prob = get_or<bool>(j, "norm_topk_prob", false);
    c.routed_scaling_factor = get_or<double>(j, "routed_scaling_factor", 1.0);
    c.num_nextn_predict_layers = get_or<int>(j, "num_nextn_predict_layers", 0);
    BELUGA_CHECK(
        c.kv_lora_rank > 0 && c.qk_rope_head_dim > 0 && c.qk_rope_head_dim % 2 == 0 && c.v_head_dim > 0,
        "config.json: bad MLA dimensions");
    if (c.n_routed_experts > 0) {
      BELUGA_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.n_routed_experts &&
                       c.moe_intermediate_size > 0 && c.n_routed_experts % c.n_group == 0 &&
                       c.topk_group <= c.n_group,
                   "config.json: bad MoE dimensions");
    }
    c.head_dim = c.qk_head_dim();
  } else {
    c.head_dim = get_or<int>(j, "head_dim", c.hidden_size / c.num_heads);
    c.qkv_bias = c.arch == Arch::kQwen2 ? true : get_or<bool>(j, "attention_bias", false);
    c.qk_norm = c.arch == Arch::kQwen3;
    BELUGA_CHECK(c.num_heads % c.num_kv_heads == 0,
                 "config.json: num_attention_heads must be a multiple of num_key_value_heads");
    BELUGA_CHECK(c.head_dim % 2 == 0, "config.json: head_dim must be even");
  }

  if (j.contains("quantization_config") && j["quantization_config"].is_object()) {
    const auto& q = j["quantization_config"];
    std::string method = get_or<std::string>(q, "quant_method", "");
    BELUGA_CHECK(method == "fp8", "unsupported quantization method '", method, "' (supported: fp8)");
    c.fp8 = true;
    if (q.contains("weight_block_size") && q["weight_block_size"].is_array() &&
        q["weight_block_size"].size() == 2) {
      c.fp8_block_n = typed<int>(q["weight_block_size"][0], "weight_block_size");
      c.fp8_block_k = typed<int>(q["weight_block_size"][1], "weight_block_size");
    }
  }
  return c;
}

ModelConfig ModelConfig::from_file(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    fail(path, ": invalid JSON: ", e.what());
  }
  return from_json(j);
}

}  // namespace beluga
