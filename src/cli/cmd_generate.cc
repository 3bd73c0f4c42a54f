// `beluga generate`, `beluga logits`, `beluga inspect`: run a model on token ids.
#include <cstdio>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_args.h"
#include "engine/generator.h"
#include "loader/safetensors.h"
#include "util/error.h"

namespace beluga::cli {

namespace {

MlaMode parse_mla_mode(const Args& a) {
  const std::string m = a.get_or("mla-mode", "auto");
  if (m == "auto") return MlaMode::kAuto;
  if (m == "expanded") return MlaMode::kExpanded;
  if (m == "absorbed") return MlaMode::kAbsorbed;
  fail("--mla-mode must be auto, expanded or absorbed");
}

}  // namespace

int cmd_generate(int argc, char** argv) {
  Args a = Args::for_command(argc, argv, "generate");
  GenerateParams p;
  std::vector<int> prompt = parse_int_list(a.require("prompt-ids"));
  p.max_tokens = int(a.get_int("max-tokens", 16));
  p.temperature = float(a.get_double("temperature", 0.0));
  p.seed = uint64_t(a.get_int("seed", 0));
  p.prefill_chunk = int(a.get_int("prefill-chunk", 0));
  p.mla_mode = parse_mla_mode(a);
  if (a.has("stop-ids")) p.stop_ids = parse_int_list(a.require("stop-ids"));
  const std::string format = a.get_or("format", "json");
  BELUGA_CHECK(format == "json" || format == "text", "--format must be json or text");
  BELUGA_CHECK(p.temperature >= 0, "--temperature must be >= 0");
  const ModelArgs ma = parse_model_args(a);
  p.mla_mode = mla_mode_for(ma, p.mla_mode);
  a.check_all_used();
  LoadedModel m = load_model_dir(ma);
  Generator gen(*m.model);
  std::vector<int> out = gen.generate({prompt}, p)[0];
  if (format == "json") {
    nlohmann::json j = {{"prompt_tokens", prompt}, {"output_tokens", out}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? " " : "", out[i]);
    std::printf("\n");
  }
  return 0;
}

int cmd_logits(int argc, char** argv) {
  Args a = Args::for_command(argc, argv, "logits");
  std::vector<int> prompt = parse_int_list(a.require("prompt-ids"));
  const std::string out = a.require("out");
  const ModelArgs ma = parse_model_args(a);
  const MlaMode mode = mla_mode_for(ma, parse_mla_mode(a));
  a.check_all_used();
  LoadedModel m = load_model_dir(ma);
  Generator gen(*m.model);
  std::vector<float> logits = gen.prompt_logits(prompt, mode);
  write_safetensors(out,
                    {{"logits", DType::kF32, {int64_t(prompt.size()), m.cfg.vocab_size}, logits.data()}});
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  Args a = Args::for_command(argc, argv, "inspect");
  LoadedModel m = load_model_from_args(a);
  const ModelConfig& c = m.cfg;
  nlohmann::json j;
  j["model_dir"] = m.dir;
  j["architecture"] = arch_name(c.arch);
  j["parameters"] = m.model->num_parameters();
  j["weight_bytes"] = m.weights->total_bytes();
  j["layers"] = c.num_layers;
  j["hidden_size"] = c.hidden_size;
  j["heads"] = c.num_heads;
  j["vocab_size"] = c.vocab_size;
  j["kv_entry_values_per_layer"] = c.kv_entry_dim();
  j["kv_bytes_per_token"] = m.model->kv_bytes_per_token();
  j["kv_cache_dtype"] = std::string(dtype_name(m.ops->act_dtype()));
  j["weights_fp8"] = c.fp8;
  if (auto* ck = dynamic_cast<Checkpoint*>(m.weights.get()))
    j["dtypes"] = ck->dtype_counts();
  else
    j["dtypes"] = {{"BF16 (dummy)", m.model->num_parameters()}};
  if (c.arch == Arch::kDeepseekV4) {
    const V4Config& v = c.v4;
    j["attention"] = "DeepSeek-V4 hybrid: shared-KV MQA, sliding window + compressed (CSA / HCA)";
    std::vector<std::string> kinds, mlp;
    for (size_t l = 0; l < v.attention.size(); ++l) {
      kinds.push_back(v.attention[l] == V4Attention::kSliding ? "sliding"
                      : v.attention[l] == V4Attention::kCompressedSparse
                          ? "csa/" + std::to_string(v.compress_rate[l])
                          : "hca/" + std::to_string(v.compress_rate[l]));
      mlp.push_back(v.hash_moe[l] ? "hash_moe" : "moe");
    }
    j["layer_attention"] = kinds;
    j["layer_mlp"] = mlp;
    j["head_dim"] = c.head_dim;
    j["rope_dim"] = v.rope_dim;
    j["sliding_window"] = v.sliding_window;
    j["index_topk"] = v.index_topk;
    j["hc_mult"] = v.hc_mult;
    j["q_lora_rank"] = c.q_lora_rank;
    j["o_groups"] = v.o_groups;
    j["routed_experts"] = c.n_routed_experts;
    j["experts_per_token"] = c.num_experts_per_tok;
    j["shared_experts"] = c.n_shared_experts;
    j["kv_cache"] = "token ids only: each step recomputes its sequences' prefixes (no hybrid cache yet)";
  } else if (c.is_mla()) {
    j["attention"] = "MLA";
    j["kv_lora_rank"] = c.kv_lora_rank;
    j["q_lora_rank"] = c.q_lora_rank;
    j["routed_experts"] = c.n_routed_experts;
    j["experts_per_token"] = c.num_experts_per_tok;
    j["shared_experts"] = c.n_shared_experts;
  } else {
    j["attention"] = "GQA";
    j["kv_heads"] = c.num_kv_heads;
    j["head_dim"] = c.head_dim;
  }
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}

}  // namespace beluga::cli
