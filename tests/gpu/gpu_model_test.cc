// GPU tests: whole models. The golden fixtures on the GPU against transformers' F32 reference (5e-2
// per row: BF16 activations end to end; greedy equal to the CPU path's until the first step whose
// reference margin is < 0.5), V2-Lite's shapes against the CPU, decode graphs against eager steps,
// dummy weights and the stream-chain floor.
// Not part of ctest: tests/gpu/run.sh runs test_gpu on a machine with a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "engine/generator.h"
#include "gpu_test_support.h"
#include "loader/id_tables_from.h"
#include "loader/safetensors.h"
#include "loader/weight_source.h"

namespace beluga {
namespace {

using namespace gpu_test;

TEST_F(GpuOps, DummyWeightsMatchHost) {
  DummyWeights host;
  CudaDummyWeights dev(*gpu);
  for (const char* name : {"model.layers.3.mlp.experts.7.up_proj.weight", "model.norm.weight"}) {
    Tensor h = host.get(name, {96, 80}, DType::kBF16), d = dev.get(name, {96, 80}, DType::kBF16);
    std::vector<uint16_t> got(size_t(h.numel()));
    gpu->copy_to_host(d, got.data());
    EXPECT_EQ(0, std::memcmp(got.data(), h.data, h.nbytes())) << name;
  }
}

// bench model's stream-chain floor reads every byte of every stage once, and each stage reads the
// previous stage's result only after that stage ended (the final word then equals the host's count;
// a stage that started early would fold in a partial result). Odd sizes, an empty stage, a
// single-chunk stage and multi-wave ones, in all four shapes.
TEST_F(GpuOps, StreamChainReadsEveryByteInOrder) {
  const std::vector<int64_t> stages = {1 << 20, 17, 0, 3 << 20, 12345, 40 << 20, 16, 5 << 20};
  using SC = CudaOps::StreamChain;
  for (SC shape : {SC::kKernels, SC::kKernelsEarly, SC::kPersistent, SC::kPersistentEarly}) {
    const std::optional<CudaOps::StreamChainResult> r = gpu->measure_stream_chain(stages, shape);
    ASSERT_TRUE(r.has_value()) << "62 MB did not fit";
    EXPECT_EQ(r->result, r->expected) << "shape " << int(shape);
    EXPECT_GT(r->seconds, 0.0);
  }
}

// ---- whole models ----
std::vector<int64_t> ints(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  const int64_t* p = static_cast<const int64_t*>(t.data);
  return std::vector<int64_t>(p, p + t.nbytes / 8);
}

class GpuModel : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuModel, LogitsAndGreedyMatch) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = source_dir() + "/tests/fixtures/" + GetParam();
  const ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  Checkpoint ckpt(dir);
  CudaOps gops;
  CpuOps cops;
  auto gm = load_model(cfg, ckpt, gops, 1024);
  auto cm = load_model(cfg, ckpt, cops, 1024);
  SafetensorsFile ref(dir + "/reference.safetensors");
  Generator gg(*gm), cg(*cm);
  const int V = cfg.vocab_size;
  for (int i = 0; ref.find("prompt_" + std::to_string(i)); ++i) {
    const std::string s = std::to_string(i);
    auto p64 = ints(ref, "prompt_" + s);
    std::vector<int> prompt(p64.begin(), p64.end());
    auto pos = ints(ref, "logit_pos_" + s);
    const float* want = static_cast<const float*>(ref.get("logits_" + s).data);
    for (MlaMode mode : {MlaMode::kExpanded, MlaMode::kAbsorbed}) {
      if (!cfg.is_mla() && mode == MlaMode::kAbsorbed) continue;
      std::vector<float> ours = gg.prompt_logits(prompt, mode);
      std::vector<double> err;
      for (size_t r = 0; r < pos.size(); ++r) {
        std::vector<float> a(ours.begin() + pos[r] * V, ours.begin() + (pos[r] + 1) * V),
            b(want + r * V, want + (r + 1) * V);
        err.push_back(rel_l2(a, b));
        EXPECT_LE(err.back(), 0.5) << "prompt " << i << " row " << pos[r] << " mode " << int(mode);
      }
      // BF16 activations end to end: most rows within 5e-2 of the F32 reference; a few rows may
      // route a token to another expert on a near tie (tiny fixtures, hidden 64), hence the tail.
      std::sort(err.begin(), err.end());
      const double median = err[err.size() / 2], p90 = err[err.size() * 9 / 10];
      EXPECT_LE(median, 3e-2) << "prompt " << i << " mode " << int(mode);
      EXPECT_LE(p90, 5e-2) << "prompt " << i << " mode " << int(mode);
      std::printf("  %s prompt %d mode %d: rows %zu, rel L2 median %.4f p90 %.4f max %.4f\n",
                  GetParam().c_str(), i, int(mode), err.size(), median, p90, err.back());
    }
    GenerateParams gp;
    gp.max_tokens = 12;
    auto gt = gg.generate({prompt}, gp)[0];
    auto ct = cg.generate({prompt}, gp)[0];
    const float* margin = static_cast<const float*>(ref.get("margin_" + s).data);
    size_t k = 0;
    for (; k < gt.size() && margin[k] >= 0.5f; ++k)
      ASSERT_EQ(gt[k], ct[k]) << "prompt " << i << " step " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuModel,
                         ::testing::Values("dsv3-tiny", "dsv3-tiny-fp8", "dsv2-lite-tiny", "qwen3-tiny"));

// DeepSeek-V2-Lite's shapes in two layers with dummy weights, on the GPU and on the CPU (the same weights).
ModelConfig v2_lite_two_layers() {
  ModelConfig cfg = ModelConfig::from_file(source_dir() + "/bench/configs/deepseek-v2-lite/config.json");
  cfg.num_layers = 2;
  return cfg;
}
struct V2LiteOnBoth {
  ModelConfig cfg = v2_lite_two_layers();
  DummyWeights hw;
  CudaOps gops;
  CudaDummyWeights dw{gops};
  CpuOps cops{CpuOptions{0, true}};
  std::unique_ptr<Model> gm = load_model(cfg, dw, gops, 2048), cm = load_model(cfg, hw, cops, 2048);
};

// The DeepSeek-V2-Lite shapes with dummy weights (tensor-core attention, grouped GEMM tiles of both
// heights): a GPU forward agrees with the CPU forward of the same weights on the last rows.
TEST(GpuModelLarge, DeepseekV2LiteTwoLayersMatchesCpu) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  V2LiteOnBoth both;
  const ModelConfig& cfg = both.cfg;
  Generator gg(*both.gm), cg(*both.cm);
  std::vector<int> prompt(300);
  for (auto& t : prompt) t = int(rng()() % cfg.vocab_size);
  for (MlaMode mode : {MlaMode::kExpanded, MlaMode::kAbsorbed}) {
    auto a = gg.prompt_logits(prompt, mode), b = cg.prompt_logits(prompt, mode);
    const int V = cfg.vocab_size;
    for (int r : {0, 150, 299}) {
      std::vector<float> x(a.begin() + int64_t(r) * V, a.begin() + int64_t(r + 1) * V),
          y(b.begin() + int64_t(r) * V, b.begin() + int64_t(r + 1) * V);
      EXPECT_LE(rel_l2(x, y), 5e-2) << "row " << r << " mode " << int(mode);
    }
  }
}

// Decode steps replayed from CUDA graphs (padded batch buckets, power-of-two block-table widths)
// give the eager path's logits: batch sizes 1..5 (buckets 1, 2, 4, 4, 8), contexts crossing the
// 64- and 128-token widths, and a long prefill halfway that reallocates scratch (graphs re-recorded).
void check_graphs_match_eager(const ModelConfig& cfg, WeightSource& wa, WeightSource& wb, CudaOps& ops) {
  auto ga = load_model(cfg, wa, ops, 2048);
  auto gb = load_model(cfg, wb, ops, 2048);
  gb->set_enforce_eager(true);
  const int V = cfg.vocab_size, kSeqs = 6, kBlocksPerSeq = 8;
  KvCache ka = ga->make_kv_cache(kSeqs * kBlocksPerSeq), kb = gb->make_kv_cache(kSeqs * kBlocksPerSeq);
  auto table = [&](int s) {
    std::vector<int> t(kBlocksPerSeq);
    for (int i = 0; i < kBlocksPerSeq; ++i) t[size_t(i)] = s * kBlocksPerSeq + i;
    return t;
  };
  std::vector<int> len = {50, 63, 64, 100, 7}, next(5);
  {  // prefill all five in one eager step
    Batch b;
    for (int s = 0; s < 5; ++s) {
      for (int i = 0; i < len[size_t(s)]; ++i) b.tokens.push_back(int(rng()() % V));
      b.seqs.push_back({0, len[size_t(s)], table(s)});
      b.logit_rows.push_back(int(b.tokens.size()) - 1);
    }
    std::vector<float> la(5 * size_t(V)), lb(5 * size_t(V));
    ga->forward(b, ka, la.data());
    gb->forward(b, kb, lb.data());
    for (int s = 0; s < 5; ++s)
      next[size_t(s)] = int(std::max_element(la.begin() + int64_t(s) * V, la.begin() + int64_t(s + 1) * V) -
                            (la.begin() + int64_t(s) * V));
  }
  double worst = 0;
  for (int step = 0; step < 60; ++step) {
    if (step == 30) {  // a long prefill on a sixth sequence: scratch grows, recorded graphs go stale
      Batch b;
      for (int i = 0; i < 400; ++i) b.tokens.push_back(int(rng()() % V));
      b.seqs.push_back({0, 400, table(5)});
      b.logit_rows.push_back(399);
      std::vector<float> la(V), lb(V);
      ga->forward(b, ka, la.data());
      gb->forward(b, kb, lb.data());
    }
    const int n = 1 + step % 5;
    Batch b;
    for (int s = 0; s < n; ++s) {
      b.tokens.push_back(next[size_t(s)]);
      b.seqs.push_back({len[size_t(s)], 1, table(s)});
      b.logit_rows.push_back(s);
    }
    std::vector<float> la(size_t(n) * V), lb(size_t(n) * V);
    ga->forward(b, ka, la.data());
    gb->forward(b, kb, lb.data());
    // The same step again with greedy sampling on the device (it rewrites the same KV entries).
    std::vector<int32_t> greedy(size_t(n), -1);
    ForwardOptions fo;
    fo.greedy_tokens = greedy.data();
    ga->forward(b, ka, nullptr, fo);
    for (int s = 0; s < n; ++s) {
      const auto row = la.begin() + int64_t(s) * V;
      ASSERT_EQ(greedy[size_t(s)], int(std::max_element(row, row + V) - row)) << "step " << step;
    }
    for (int s = 0; s < n; ++s) {
      std::vector<float> x(la.begin() + int64_t(s) * V, la.begin() + int64_t(s + 1) * V),
          y(lb.begin() + int64_t(s) * V, lb.begin() + int64_t(s + 1) * V);
      const double e = rel_l2(x, y);
      worst = std::max(worst, e);
      ASSERT_LE(e, 2e-2) << "step " << step << " seq " << s;
      next[size_t(s)] = int(std::max_element(x.begin(), x.end()) - x.begin());
      len[size_t(s)]++;
    }
  }
  EXPECT_GT(ga->num_graphs(), 0);
  EXPECT_EQ(gb->num_graphs(), 0);
  std::printf("  graphs vs eager: worst rel L2 %.2e, %d graphs live\n", worst, ga->num_graphs());
}

// A step mixing decodes with a prompt chunk attends each run of sequences its own way (decodes absorbed
// through the MLA decode kernel, the chunk expanded, each on its slice of the step's metadata): every
// row kind agrees with the CPU's step, with runs short, long, short.
TEST(GpuModelLarge, MixedDecodeAndPromptStepMatchesCpu) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  V2LiteOnBoth both;
  const ModelConfig& cfg = both.cfg;
  Model *gm = both.gm.get(), *cm = both.cm.get();
  const int V = cfg.vocab_size;
  KvCache gkv = gm->make_kv_cache(8), ckv = cm->make_kv_cache(8);
  std::vector<int> a(201), b(40), c(91);
  for (auto* v : {&a, &b, &c})
    for (int& t : *v) t = int(rng()() % cfg.vocab_size);
  auto step = [&](const Batch& batch, std::vector<float>& g, std::vector<float>& h) {
    g.assign(std::max<size_t>(1, batch.logit_rows.size()) * size_t(V), 0.0f);
    h = g;
    gm->forward(batch, gkv, g.data(), {});
    cm->forward(batch, ckv, h.data(), {});
  };
  std::vector<float> g, h;
  Batch prefill;  // a (200 tokens, blocks 0-3) and c (90, blocks 4-5)
  prefill.tokens.assign(a.begin(), a.end() - 1);
  prefill.tokens.insert(prefill.tokens.end(), c.begin(), c.end() - 1);
  prefill.seqs = {{0, 200, {0, 1, 2, 3}}, {0, 90, {4, 5}}};
  step(prefill, g, h);
  Batch mixed;  // a's decode, b's prompt (block 6), c's decode
  mixed.tokens = {a.back()};
  mixed.tokens.insert(mixed.tokens.end(), b.begin(), b.end());
  mixed.tokens.push_back(c.back());
  mixed.seqs = {{200, 1, {0, 1, 2, 3}}, {0, 40, {6}}, {90, 1, {4, 5}}};
  mixed.logit_rows = {0, 40, 41};
  step(mixed, g, h);
  for (int r = 0; r < 3; ++r) {
    std::vector<float> x(g.begin() + int64_t(r) * V, g.begin() + int64_t(r + 1) * V),
        y(h.begin() + int64_t(r) * V, h.begin() + int64_t(r + 1) * V);
    EXPECT_LE(rel_l2(x, y), 5e-2) << "logit row " << r;
  }
}

TEST(GpuGraphs, DecodeStepsMatchEager) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  // DeepSeek-V4's hybrid cache too: its step ops address the cache from the step's device arrays.
  for (const char* fx : {"dsv3-tiny", "qwen3-tiny", "dsv4-tiny", "dsv4-tiny-hca16"}) {
    SCOPED_TRACE(fx);
    const std::string dir = source_dir() + "/tests/fixtures/" + fx;
    Checkpoint ckpt(dir);
    CudaOps ops;
    check_graphs_match_eager(ModelConfig::from_file(dir + "/config.json"), ckpt, ckpt, ops);
  }
  {  // V4 shapes: 4 layers (HCA 128 x 3, then CSA 4 with the 64-head indexer), 64 heads of 512
    SCOPED_TRACE("deepseek-v4 shape, 4 layers");
    ModelConfig cfg = ModelConfig::from_file(source_dir() + "/bench/configs/deepseek-v4-shape/config.json");
    cfg.num_layers = 4;
    cfg.n_routed_experts = 32;  // two models' weights fit one GPU (256 experts are 12.9 GB a layer)
    CudaOps ops;
    // The hash layers' token -> experts tables come from the host's dummy source (valid expert ids).
    IdTablesFrom wa(std::make_unique<CudaDummyWeights>(ops), std::make_unique<DummyWeights>()),
        wb(std::make_unique<CudaDummyWeights>(ops), std::make_unique<DummyWeights>());
    check_graphs_match_eager(cfg, wa, wb, ops);
  }
  {  // V2-Lite shapes: the tensor-core MLA decode kernel with its split-KV plan
    SCOPED_TRACE("deepseek-v2-lite, 2 layers");
    ModelConfig cfg = ModelConfig::from_file(source_dir() + "/bench/configs/deepseek-v2-lite/config.json");
    cfg.num_layers = 2;
    CudaOps ops;
    CudaDummyWeights wa(ops), wb(ops);
    check_graphs_match_eager(cfg, wa, wb, ops);
  }
}

}  // namespace
}  // namespace beluga
