// Golden tests: our logits, greedy continuations and per-layer hidden states against what Hugging Face
// transformers computed (float32) for the fixtures in tests/fixtures and the demo model's reference.
// Bounds (tests/fixtures/README.md): per-row relative L2 error <= 1e-4; greedy tokens identical up to
// the first step whose top-1/top-2 margin is below 1e-3.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "backend/cpu/cpu_ops.h"
#include "engine/generator.h"
#include "loader/safetensors.h"
#include "loader/weight_source.h"
#include "model/model.h"

namespace beluga {
namespace {

std::vector<int64_t> ints(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  const int64_t* p = static_cast<const int64_t*>(t.data);
  return std::vector<int64_t>(p, p + t.nbytes / 8);
}

const float* floats(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  EXPECT_EQ(t.dtype, DType::kF32) << name;
  return static_cast<const float*>(t.data);
}

double rel_l2(const float* a, const float* ref, int n) {
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    num += double(a[i] - ref[i]) * (a[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct Loaded {
  ModelConfig cfg;
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<CpuOps> ops;
  std::unique_ptr<Model> model;
  std::unique_ptr<SafetensorsFile> ref;
};

Loaded load(const std::string& dir, CpuOptions opt = {}) {
  Loaded l;
  l.cfg = ModelConfig::from_file(dir + "/config.json");
  l.ckpt = std::make_unique<Checkpoint>(dir);
  l.ops = std::make_unique<CpuOps>(opt);
  l.model = load_model(l.cfg, *l.ckpt, *l.ops, 1024);
  l.ref = std::make_unique<SafetensorsFile>(dir + "/reference.safetensors");
  return l;
}

int num_prompts(const SafetensorsFile& f) {
  int n = 0;
  while (f.find("prompt_" + std::to_string(n))) ++n;
  return n;
}

std::vector<int> to_ids(const std::vector<int64_t>& v) {
  return std::vector<int>(v.begin(), v.end());
}

void check_logits(Loaded& l, MlaMode mode) {
  Generator gen(*l.model);
  const int V = l.cfg.vocab_size;
  const int n = num_prompts(*l.ref);
  ASSERT_GT(n, 0);
  for (int i = 0; i < n; ++i) {
    const std::string s = std::to_string(i);
    auto prompt = to_ids(ints(*l.ref, "prompt_" + s));
    auto pos = ints(*l.ref, "logit_pos_" + s);
    const float* ref = floats(*l.ref, "logits_" + s);
    std::vector<float> ours = gen.prompt_logits(prompt, mode);
    for (size_t r = 0; r < pos.size(); ++r) {
      double e = rel_l2(ours.data() + pos[r] * V, ref + r * V, V);
      EXPECT_LE(e, 1e-4) << "prompt " << i << " position " << pos[r] << " mode " << int(mode);
    }
  }
}

void check_greedy(Loaded& l) {
  Generator gen(*l.model);
  const int n = num_prompts(*l.ref);
  for (int i = 0; i < n; ++i) {
    const std::string s = std::to_string(i);
    auto prompt = to_ids(ints(*l.ref, "prompt_" + s));
    auto greedy = ints(*l.ref, "greedy_" + s);
    const TensorInfo* margin_t = l.ref->find("margin_" + s);
    GenerateParams p;
    p.max_tokens = int(greedy.size());
    auto out = gen.generate({prompt}, p)[0];
    ASSERT_EQ(out.size(), greedy.size());
    size_t checked = 0;
    for (size_t k = 0; k < greedy.size(); ++k) {
      if (margin_t && static_cast<const float*>(margin_t->data)[k] < 1e-3f) break;  // a near tie may flip
      EXPECT_EQ(out[k], greedy[k]) << "prompt " << i << " step " << k;
      if (out[k] != greedy[k]) break;
      ++checked;
    }
    EXPECT_GT(checked, 0u) << "prompt " << i;
  }
}

class Fixture : public ::testing::TestWithParam<std::string> {
 protected:
  std::string dir() const { return std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/" + GetParam(); }
};

TEST_P(Fixture, LogitsMatchExpanded) {
  Loaded l = load(dir());
  check_logits(l, MlaMode::kExpanded);
}

TEST_P(Fixture, LogitsMatchAbsorbed) {
  Loaded l = load(dir());
  check_logits(l, MlaMode::kAbsorbed);
}

TEST_P(Fixture, GreedyIncrementalDecodeMatches) {
  Loaded l = load(dir());
  check_greedy(l);
}

TEST_P(Fixture, HiddenStatesMatchLayerByLayer) {
  Loaded l = load(dir());
  Generator gen(*l.model);
  std::vector<std::vector<float>> hidden;
  gen.prompt_logits(to_ids(ints(*l.ref, "prompt_0")), MlaMode::kAuto, &hidden);
  const TensorInfo& ref = l.ref->get("hidden_0");
  const int64_t rows = ref.shape[0], D = ref.shape[1];
  const int L = l.cfg.num_layers;
  // Ours: embedding, after each layer, after the final norm. Transformers replaces its last entry
  // (after layer L-1) with the final norm's output.
  ASSERT_EQ(int64_t(hidden.size()), L + 2);
  ASSERT_EQ(rows, L + 1);
  for (int64_t r = 0; r < rows; ++r) {
    const auto& ours = r == rows - 1 ? hidden.back() : hidden[size_t(r)];
    EXPECT_LE(rel_l2(ours.data(), static_cast<const float*>(ref.data) + r * D, int(D)), 1e-4)
        << "hidden row " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Fixture,
                         ::testing::Values("dsv3-tiny", "dsv3-tiny-fp8", "dsv2-lite-tiny", "qwen3-tiny"));

// DeepSeek-V4 (hybrid attention, hyper-connections, hash MoE): logits at every position of each
// prompt, and greedy continuations decoded step by step through the model's cache (this slice
// recomputes every sequence's prefix from the token ids the cache holds).
class V4Fixture : public Fixture {};

TEST_P(V4Fixture, LogitsMatchAtEveryPosition) {
  Loaded l = load(dir());
  check_logits(l, MlaMode::kAuto);
}

TEST_P(V4Fixture, GreedyDecodeMatches) {
  Loaded l = load(dir());
  check_greedy(l);
}

// Two sequences of different lengths in one batch, one of them split into a cached prefix and a new
// chunk: each sequence's rows equal those of the same sequence run alone.
TEST_P(V4Fixture, BatchedAndChunkedSequencesMatchSingle) {
  Loaded l = load(dir());
  Generator gen(*l.model);
  const int V = l.cfg.vocab_size;
  auto a = to_ids(ints(*l.ref, "prompt_1"));
  auto b = to_ids(ints(*l.ref, "prompt_0"));
  const std::vector<float> ra = gen.prompt_logits(a, MlaMode::kAuto),
                           rb = gen.prompt_logits(b, MlaMode::kAuto);
  const int na = int(a.size()), nb = int(b.size()), split = na / 2;
  KvCache kv = l.model->make_kv_cache(4);
  // Step 1: the first half of a alone (its KV only). Step 2: a's second half next to all of b.
  Batch first;
  first.tokens.assign(a.begin(), a.begin() + split);
  first.seqs.push_back({0, split, {0}});
  l.model->forward(first, kv, nullptr);
  Batch both;
  both.tokens.assign(a.begin() + split, a.end());
  both.tokens.insert(both.tokens.end(), b.begin(), b.end());
  both.seqs.push_back({split, na - split, {0}});
  both.seqs.push_back({0, nb, {2}});
  for (int i = 0; i < na - split + nb; ++i) both.logit_rows.push_back(i);
  std::vector<float> out(both.logit_rows.size() * size_t(V));
  l.model->forward(both, kv, out.data());
  for (int i = 0; i < na - split; ++i)
    EXPECT_LE(rel_l2(out.data() + size_t(i) * V, ra.data() + size_t(split + i) * V, V), 1e-6)
        << "a row " << i;
  for (int i = 0; i < nb; ++i)
    EXPECT_LE(rel_l2(out.data() + size_t(na - split + i) * V, rb.data() + size_t(i) * V, V), 1e-6)
        << "b row " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, V4Fixture, ::testing::Values("dsv4-tiny-hca16", "dsv4-tiny"));

// The built-in demo model: four shards and an index; its own reference holds the last rows of logits
// and a greedy continuation for two chat prompts.
TEST(DemoModel, ShardedCheckpointMatchesReference) {
  Loaded l = load(std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp");
  check_logits(l, MlaMode::kAuto);
  check_greedy(l);
}

}  // namespace
}  // namespace beluga
