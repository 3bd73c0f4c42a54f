// Properties of the model runtime that must hold for any weights (random ones here, on shapes larger
// than the fixtures): expanded and absorbed MLA agree; chunked prefill, incremental decode and batching
// with other sequences do not change results; BF16 activations stay close to F32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "engine/generator.h"
#include "loader/weight_source.h"
#include "model/model.h"
#include "util/error.h"

namespace beluga {
namespace {

ModelConfig dsv3_like() {
  return ModelConfig::from_json(nlohmann::json::parse(R"({
    "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 3, "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 64,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 64, "n_shared_experts": 1, "first_k_dense_replace": 1,
    "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
    "routed_scaling_factor": 2.5, "max_position_embeddings": 4096,
    "rope_scaling": {"type": "yarn", "factor": 4, "original_max_position_embeddings": 1024, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}})"));
}

ModelConfig llama_like() {
  return ModelConfig::from_json(nlohmann::json::parse(R"({
    "model_type": "llama", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
    "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
    "high_freq_factor": 4.0, "original_max_position_embeddings": 256}})"));
}

std::vector<int> prompt(int n, int seed) {
  std::vector<int> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 37 + seed * 101 + 11) % 512;
  return p;
}

double max_rel_row_error(const std::vector<float>& a, const std::vector<float>& b, int V) {
  double worst = 0;
  for (size_t r = 0; r < a.size() / V; ++r) {
    double num = 0, den = 0;
    for (int i = 0; i < V; ++i) {
      num += std::pow(a[r * V + i] - b[r * V + i], 2);
      den += std::pow(b[r * V + i], 2);
    }
    worst = std::max(worst, std::sqrt(num / den));
  }
  return worst;
}

TEST(ModelConsistency, ExpandedAndAbsorbedMlaAgree) {
  DummyWeights w(1);
  CpuOps ops({2});
  auto m = load_model(dsv3_like(), w, ops);
  Generator g(*m);
  auto p = prompt(150, 1);  // spans three KV blocks
  auto a = g.prompt_logits(p, MlaMode::kExpanded);
  auto b = g.prompt_logits(p, MlaMode::kAbsorbed);
  EXPECT_LE(max_rel_row_error(a, b, 512), 1e-5);
}

void check_decode_invariance(const ModelConfig& cfg) {
  DummyWeights w(2);
  CpuOps ops({2});
  auto m = load_model(cfg, w, ops);
  Generator g(*m);
  GenerateParams whole;
  whole.max_tokens = 20;
  auto p1 = prompt(70, 2), p2 = prompt(5, 3), p3 = prompt(130, 4);
  auto ref1 = g.generate({p1}, whole)[0];
  ASSERT_EQ(ref1.size(), 20u);
  GenerateParams chunked = whole;
  chunked.prefill_chunk = 16;  // several chunks, one across a block boundary
  EXPECT_EQ(g.generate({p1}, chunked)[0], ref1);
  // The same prompt in a batch with others of different lengths.
  auto batch = g.generate({p2, p1, p3}, whole);
  EXPECT_EQ(batch[1], ref1);
  EXPECT_EQ(batch[0], g.generate({p2}, whole)[0]);
  EXPECT_EQ(batch[2], g.generate({p3}, whole)[0]);
  // Incremental decode equals a full prefill of prompt + generated tokens (last-position argmax).
  std::vector<int> full = p1;
  full.insert(full.end(), ref1.begin(), ref1.end() - 1);
  auto logits = g.prompt_logits(full);
  const float* last = logits.data() + (full.size() - 1) * size_t(cfg.vocab_size);
  EXPECT_EQ(int(std::max_element(last, last + cfg.vocab_size) - last), ref1.back());
}

TEST(ModelConsistency, DeepseekDecodeIsInvariantToChunkingAndBatching) {
  check_decode_invariance(dsv3_like());
}

TEST(ModelConsistency, DenseDecodeIsInvariantToChunkingAndBatching) {
  check_decode_invariance(llama_like());
}

// Rounding activations to 8 mantissa bits before each GEMM costs ~0.4% per product, averaged over K;
// on the dsv3-tiny fixture (MoE routing included) the logits stay within 2%.
TEST(ModelConsistency, Bf16ActivationsStayCloseToF32) {
  const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv3-tiny";
  ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  Checkpoint w(dir);
  CpuOps f32({2, false}), bf16({2, true});
  auto a = load_model(cfg, w, f32);
  auto b = load_model(cfg, w, bf16);
  std::vector<int> p = prompt(40, 5);
  auto la = Generator(*a).prompt_logits(p), lb = Generator(*b).prompt_logits(p);
  const double e = max_rel_row_error(lb, la, cfg.vocab_size);
  EXPECT_LE(e, 2e-2) << e;
  EXPECT_GT(e, 0.0);  // the path really differs
  // A dense model (no routing decisions to flip) with random weights.
  DummyWeights dw(3);
  auto c = load_model(llama_like(), dw, f32);
  auto d = load_model(llama_like(), dw, bf16);
  const double e2 = max_rel_row_error(Generator(*d).prompt_logits(p), Generator(*c).prompt_logits(p), 512);
  EXPECT_LE(e2, 2e-2) << e2;
  EXPECT_GT(e2, 0.0);
}

TEST(ModelConsistency, RejectsBadInputWithErrors) {
  DummyWeights w(4);
  CpuOps ops({1});
  auto m = load_model(llama_like(), w, ops, 256);
  Generator g(*m);
  EXPECT_THROW(g.prompt_logits({1, 2, 512}), Error);     // token outside the vocabulary
  EXPECT_THROW(g.prompt_logits({}), Error);              // empty prompt
  EXPECT_THROW(g.prompt_logits(prompt(300, 1)), Error);  // beyond max positions
}

// ForwardOptions::greedy_tokens returns each logit row's argmax (lowest id on ties) instead of the
// logits; the logits buffer is left alone.
TEST(ModelConsistency, GreedyTokensAreTheLogitArgmax) {
  DummyWeights w(5);
  CpuOps ops({1});
  auto m = load_model(dsv3_like(), w, ops, 512);
  KvCache kv = m->make_kv_cache(4);
  Batch b;
  b.tokens = prompt(40, 3);
  b.seqs.push_back({0, 40, {0}});
  b.logit_rows = {9, 20, 39};
  std::vector<float> logits(3 * 512);
  m->forward(b, kv, logits.data());
  std::vector<int32_t> ids(3, -1);
  std::vector<float> untouched(3 * 512, 7.0f);
  ForwardOptions opt;
  opt.greedy_tokens = ids.data();
  m->forward(b, kv, untouched.data(), opt);
  for (int r = 0; r < 3; ++r) {
    const auto row = logits.begin() + r * 512;
    EXPECT_EQ(ids[size_t(r)], int(std::max_element(row, row + 512) - row)) << "row " << r;
  }
  EXPECT_EQ(untouched, std::vector<float>(3 * 512, 7.0f));

  // Ties: the lowest index, as std::max_element.
  std::vector<float> t = {1, 5, 5, 2, -INFINITY, -INFINITY};
  std::vector<int32_t> out(2);
  std::vector<float> prob(2);
  ops.argmax_rows(Tensor::make(out.data(), DType::kI32, {2}), Tensor::make(t.data(), DType::kF32, {2, 3}),
                  Tensor::make(prob.data(), DType::kF32, {2}));
  EXPECT_EQ(out, (std::vector<int32_t>{1, 0}));
  // With probs: the softmax probability of the argmax (two tied maxima share it; a row of one finite
  // logit is certain).
  EXPECT_NEAR(prob[0], std::exp(5.0) / (std::exp(1.0) + 2 * std::exp(5.0)), 1e-6);
  EXPECT_FLOAT_EQ(prob[1], 1.0f);
}

// A step mixing a prompt chunk with a decode attends the decode absorbed (in latent space) and only
// the chunk expanded: expanding the decode's context would rebuild its k/v, [context, H * (nope + v)]
// (the step's scratch, 4 MB at a 3000-token context here, against ~1 MB for the rest of the step).
TEST(ModelConsistency, MixedStepAttendsItsDecodesAbsorbed) {
  auto scratch_of_mixed_step = [](int context) {
    DummyWeights w(3);
    CpuOps ops({1});
    auto m = load_model(dsv3_like(), w, ops, 4096);
    KvCache kv = m->make_kv_cache(64);
    const int decode_blocks = (context + 1 + kKvBlockSize - 1) / kKvBlockSize;
    std::vector<int> decode_table(static_cast<size_t>(decode_blocks)), prompt_table{decode_blocks};
    for (int i = 0; i < decode_blocks; ++i) decode_table[size_t(i)] = i;
    Batch b;
    b.tokens = {7};
    const std::vector<int> chunk = prompt(32, 5);
    b.tokens.insert(b.tokens.end(), chunk.begin(), chunk.end());
    b.seqs = {{context, 1, decode_table}, {0, 32, prompt_table}};
    b.logit_rows = {0, 32};
    std::vector<float> logits(2 * 512);
    m->forward(b, kv, logits.data(), {});
    for (float x : logits) EXPECT_TRUE(std::isfinite(x));
    return ops.scratch_capacity();
  };
  const size_t near = scratch_of_mixed_step(63), far = scratch_of_mixed_step(3000);
  EXPECT_LT(far, 2 * near) << "context 63: " << near << " bytes of scratch, context 3000: " << far;
}

// A step's scratch is one layer's plus the hidden state, not one per layer: a 12-layer model needs no
// more scratch than a 2-layer one of the same width for the same batch.
TEST(ModelConsistency, ScratchDoesNotGrowWithLayers) {
  auto scratch_after_prefill = [](int layers) {
    nlohmann::json j = nlohmann::json::parse(R"({
      "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 128, "intermediate_size": 256,
      "num_attention_heads": 4, "q_lora_rank": 64, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
      "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
      "moe_intermediate_size": 64, "n_shared_experts": 1, "first_k_dense_replace": 1,
      "max_position_embeddings": 4096})");
    j["num_hidden_layers"] = layers;
    DummyWeights w(7);
    CpuOps ops({1});
    auto m = load_model(ModelConfig::from_json(j), w, ops, 1024);
    Generator(*m).prompt_logits(prompt(300, 2));
    return ops.scratch_capacity();
  };
  const size_t two = scratch_after_prefill(2), twelve = scratch_after_prefill(12);
  EXPECT_GT(two, 0u);
  EXPECT_LE(twelve, two) << "2 layers: " << two << " bytes, 12 layers: " << twelve;
}

}  // namespace
}  // namespace beluga
