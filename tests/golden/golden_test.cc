// Golden tests: our logits, greedy continuations and per-layer hidden states against what Hugging Face
// transformers computed (float32) for the fixtures in tests/fixtures and the demo model's reference.
// Bounds (tests/fixtures/README.md): per-row relative L2 error <= 1e-4; greedy tokens identical up to
// the first step whose top-1/top-2 margin is below 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>

#include "../common/tensor_parallel_pair.h"
#include "backend/cpu/cpu_ops.h"
#include "engine/generator.h"
#include "golden_test_support.h"
#include "loader/safetensors.h"
#include "loader/weight_source.h"
#include "model/model.h"

namespace beluga {
namespace {

using testing::ints;
using testing::rel_l2;

const float* floats(const SafetensorsFile& f, const std::string& name) {
  const TensorInfo& t = f.get(name);
  EXPECT_EQ(t.dtype, DType::kF32) << name;
  return static_cast<const float*>(t.data);
}

struct Loaded {
  ModelConfig cfg;
  std::unique_ptr<Checkpoint> ckpt;
  std::unique_ptr<CpuOps> ops;
  std::unique_ptr<Model> model;
  std::unique_ptr<SafetensorsFile> ref;
};

// `v4_topk` > 0 replaces a DeepSeek-V4 config's index_topk (see V4Fixture).
Loaded load(const std::string& dir, CpuOptions opt = {}, int v4_topk = 0) {
  Loaded l;
  l.cfg = ModelConfig::from_file(dir + "/config.json");
  if (v4_topk > 0) l.cfg.v4.index_topk = v4_topk;
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

// Tensor parallel (`--tensor-parallel-size 2`): a checkpoint split over two CPU thread ranks against
// transformers' logits (every prompt, prefill) and greedy tokens (decode through the split caches),
// within the bounds one model meets. qwen3-tiny: heads, KV heads and MLP split, each rank caching its
// own KV heads. dsv3-tiny (q_a / q_b) and dsv2-lite-tiny (one q projection, stacked with kv_a): the
// query heads and the dense MLP layer split, the latent cache whole on each rank, the routed experts
// over the same ranks.
class TensorParallelGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelGolden, TwoRanksMatchTransformers) {
  const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/" + GetParam();
  Loaded l;
  l.cfg = ModelConfig::from_file(dir + "/config.json");
  l.ckpt = std::make_unique<Checkpoint>(dir);
  l.ref = std::make_unique<SafetensorsFile>(dir + "/reference.safetensors");
  test::TensorParallelGroup tp(l.cfg, *l.ckpt, 1024);
  l.model = std::move(tp.model);
  const size_t one = size_t(l.cfg.num_layers) * size_t(l.cfg.kv_entry_dim()) * sizeof(float);
  EXPECT_EQ(l.model->kv_bytes_per_token(), l.cfg.is_mla() ? one : one / 2)
      << "a dense model's ranks cache half the KV heads each, a DeepSeek model's the whole latent";
  check_logits(l, MlaMode::kExpanded);
  if (l.cfg.is_mla()) check_logits(l, MlaMode::kAbsorbed);
  check_greedy(l);
  tp.model = std::move(l.model);  // the group's destructor detaches its peers from rank 0
}

// Expert parallel (`--expert-parallel-size 2`, replicated tokens: each rank routes half of every
// step's tokens, a 300-token prompt's rows 0-149 on rank 0 and 150-299 on rank 1) against
// transformers, as one model is.
class ExpertParallelGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ExpertParallelGolden, TwoRanksMatchTransformers) {
  const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/" + GetParam();
  Loaded l;
  l.cfg = ModelConfig::from_file(dir + "/config.json");
  l.ckpt = std::make_unique<Checkpoint>(dir);
  l.ref = std::make_unique<SafetensorsFile>(dir + "/reference.safetensors");
  LocalGroup group(2);
  const ExpertSharding sharding = ExpertSharding::contiguous(l.cfg.n_routed_experts, 2);
  CpuOps ops(CpuOptions{1});
  const ExpertParallelism ep{&group.communicator(0), &sharding, true};
  l.model = load_model(l.cfg, *l.ckpt, ops, 1024, &ep);
  ThreadRankPeers peers(l.cfg, *l.ckpt, 1024, group, sharding, cpu_peer_ops(2, CpuOptions{1}));
  l.model->set_step_peers(&peers);
  check_logits(l, MlaMode::kExpanded);
  check_logits(l, MlaMode::kAbsorbed);
  check_greedy(l);
  l.model->set_step_peers(nullptr);
  l.model.reset();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExpertParallelGolden, ::testing::Values("dsv3-tiny", "dsv2-lite-tiny"));

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelGolden,
                         ::testing::Values("qwen3-tiny", "dsv3-tiny", "dsv2-lite-tiny"));

// DeepSeek-V4 (hybrid attention, hyper-connections, hash MoE): logits at every position of each
// prompt, and greedy continuations decoded step by step through the hybrid cache (window rows,
// compressor projections and compressed entries; nothing is recomputed).
//
// The reference's indexer breaks ties at the top-k cut (exact zeros after the ReLU) as torch.topk
// does, which depends on how many entries the forward holds (Ops::indexer_topk): a full forward over
// N tokens may pick differently for an early row than one over N - 1 tokens did. A cache keeps each
// row as the step that ran it computed it (as transformers' own cache does), so with ties at the cut
// no cache equals a forward over the whole sequence. The cache's mechanics are therefore checked
// exactly with index_topk above the number of entries (selection keeps every entry: nothing to tie),
// and the real top-k against transformers' greedy while the reference is stable in length.
class V4Fixture : public Fixture {};
constexpr int kAllEntries = 512;  // > the entries of any fixture prompt (300 / 4)

// Runs `prompts` together through one cache: the first `prefill` tokens of each in chunks of
// `chunk` (all sequences in the same steps), then one token per sequence per step to the end.
// Returns every position's logits per sequence ([len, vocab]); sequence s owns blocks
// [s * per_seq, (s + 1) * per_seq).
std::vector<std::vector<float>> incremental_logits(Model& m, const std::vector<std::vector<int>>& prompts,
                                                   int prefill, int chunk) {
  const int V = m.config().vocab_size, S = int(prompts.size());
  int per_seq = 1;
  for (const auto& p : prompts) per_seq = std::max(per_seq, int(p.size() + kKvBlockSize - 1) / kKvBlockSize);
  KvCache kv = m.make_kv_cache(per_seq * S);
  std::vector<std::vector<float>> out(static_cast<size_t>(S));
  std::vector<int> done(size_t(S), 0);
  for (int s = 0; s < S; ++s) out[size_t(s)].resize(prompts[size_t(s)].size() * size_t(V));
  for (bool more = true; more;) {
    more = false;
    Batch b;
    std::vector<std::pair<int, int>> rows;  // (sequence, position) of each logit row
    for (int s = 0; s < S; ++s) {
      const auto& p = prompts[size_t(s)];
      const int start = done[size_t(s)], n = int(p.size());
      if (start >= n) continue;
      const int len = start < prefill ? std::min({chunk, prefill - start, n - start}) : 1;
      std::vector<int> table;
      for (int i = 0; i * kKvBlockSize < start + len; ++i) table.push_back(s * per_seq + i);
      b.seqs.push_back({start, len, table});
      for (int i = 0; i < len; ++i) {
        rows.push_back({s, start + i});
        b.logit_rows.push_back(int(b.tokens.size()));
        b.tokens.push_back(p[size_t(start + i)]);
      }
      done[size_t(s)] += len;
      more = more || done[size_t(s)] < n;
    }
    if (b.tokens.empty()) break;
    std::vector<float> lg(b.logit_rows.size() * size_t(V));
    m.forward(b, kv, lg.data());
    for (size_t i = 0; i < rows.size(); ++i)
      std::copy_n(lg.data() + i * size_t(V), V,
                  out[size_t(rows[i].first)].data() + size_t(rows[i].second) * V);
  }
  return out;
}

// Prefill (in odd-sized chunks of 23) then token-by-token decode through the hybrid cache gives, at
// every position of every prompt, the logits of one forward over the whole prompt (1e-5: only the
// GEMMs' row blocking differs). The 300-token prompt of dsv4-tiny completes two HCA entries (rate
// 128) and ~75 CSA entries during decode.
TEST_P(V4Fixture, IncrementalDecodeMatchesFullForward) {
  Loaded l = load(dir(), {}, kAllEntries);
  Generator gen(*l.model);
  const int V = l.cfg.vocab_size;
  for (int i = 0; i < num_prompts(*l.ref); ++i) {
    const std::string s = std::to_string(i);
    auto prompt = to_ids(ints(*l.ref, "prompt_" + s));
    const int n = int(prompt.size());
    const std::vector<float> full = gen.prompt_logits(prompt, MlaMode::kAuto);
    for (int prefill : {1, n / 2}) {
      const std::vector<float> inc = incremental_logits(*l.model, {prompt}, std::max(1, prefill), 23)[0];
      for (int p = 0; p < n; ++p)
        ASSERT_LE(rel_l2(inc.data() + size_t(p) * V, full.data() + size_t(p) * V, V), 1e-5)
            << "prompt " << i << " prefill " << prefill << " position " << p;
    }
  }
}

// Sequences of different lengths decode in the same steps (each at its own position, prefilled in
// chunks of 17 next to the others' decode tokens): each one's rows equal its full forward's.
TEST_P(V4Fixture, MixedBatchOfDifferentLengthsMatchesEachAlone) {
  Loaded l = load(dir(), {}, kAllEntries);
  Generator gen(*l.model);
  const int V = l.cfg.vocab_size;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < num_prompts(*l.ref); ++i)
    prompts.push_back(to_ids(ints(*l.ref, "prompt_" + std::to_string(i))));
  ASSERT_GE(prompts.size(), 3u);
  const std::vector<std::vector<float>> inc = incremental_logits(*l.model, prompts, 40, 17);
  for (size_t s = 0; s < prompts.size(); ++s) {
    const std::vector<float> full = gen.prompt_logits(prompts[s], MlaMode::kAuto);
    for (size_t p = 0; p < prompts[s].size(); ++p)
      ASSERT_LE(rel_l2(inc[s].data() + p * V, full.data() + p * V, V), 1e-5)
          << "sequence " << s << " position " << p;
  }
}

// The prefix cache's rule for V4: a later sequence that shares the first k full blocks of an earlier
// one (its block table points at them) and starts at context 64 k reproduces its own full forward:
// the shared blocks hold everything a continuation reads (window rows, entries, open-window state).
// The same blocks copied to host memory and back into another cache (the KV connector's tiers) too.
TEST_P(V4Fixture, SharedAndRestoredPrefixBlocksContinueExactly) {
  Loaded l = load(dir(), {}, kAllEntries);
  Generator gen(*l.model);
  const int V = l.cfg.vocab_size;
  std::vector<int> a;
  for (int i = 0; i < num_prompts(*l.ref); ++i) {
    auto p = to_ids(ints(*l.ref, "prompt_" + std::to_string(i)));
    if (p.size() > a.size()) a = p;
  }
  ASSERT_GT(a.size(), size_t(2 * kKvBlockSize));
  std::vector<int> b(a.begin(), a.begin() + 2 * kKvBlockSize);  // shares 2 blocks, then diverges
  for (int i = 0; i < 40; ++i) b.push_back((a[size_t(i)] * 7 + i) % V);
  const std::vector<float> full_b = gen.prompt_logits(b, MlaMode::kAuto);
  const int nb = int(b.size()), shared = 2 * kKvBlockSize;
  const int blocks_a = (int(a.size()) + kKvBlockSize - 1) / kKvBlockSize;
  KvCache kv = l.model->make_kv_cache(blocks_a + 2);
  Batch first;  // all of a in blocks 0..blocks_a-1
  first.tokens = a;
  std::vector<int> ta;
  for (int i = 0; i < blocks_a; ++i) ta.push_back(i);
  first.seqs.push_back({0, int(a.size()), ta});
  l.model->forward(first, kv, nullptr);
  auto continue_b = [&](Model& m, KvCache& cache) {
    Batch rest;
    rest.tokens.assign(b.begin() + shared, b.end());
    rest.seqs.push_back({shared, nb - shared, {0, 1, blocks_a}});
    for (int i = 0; i < nb - shared; ++i) rest.logit_rows.push_back(i);
    std::vector<float> lg(rest.logit_rows.size() * size_t(V));
    m.forward(rest, cache, lg.data());
    for (int i = 0; i < nb - shared; ++i)
      EXPECT_LE(rel_l2(lg.data() + size_t(i) * V, full_b.data() + size_t(shared + i) * V, V), 1e-5)
          << "b position " << shared + i;
  };
  continue_b(*l.model, kv);
  // Host round trip: blocks 0 and 1 of every cache tensor into a fresh cache.
  const size_t block_bytes = l.model->kv_bytes_per_token() * kKvBlockSize;
  std::vector<unsigned char> host(2 * block_bytes);
  KvCache other = l.model->make_kv_cache(blocks_a + 2);
  for (int blk = 0; blk < 2; ++blk) {
    l.ops->kv_block_to_host(kv.layers, blk, host.data() + size_t(blk) * block_bytes);
    l.ops->kv_block_from_host(other.layers, blk, host.data() + size_t(blk) * block_bytes);
  }
  continue_b(*l.model, other);
}

TEST_P(V4Fixture, LogitsMatchAtEveryPosition) {
  Loaded l = load(dir());
  check_logits(l, MlaMode::kAuto);
}

// Greedy decode through the hybrid cache with the real top-k: after prefilling the prompt, step k's
// logits equal a forward over prompt + the k tokens before it (1e-5) and its token is transformers'
// (greedy_<i>, computed by such forwards), for as long as those forwards agree with each other on the
// rows they share (1e-6): once a longer forward re-picks an earlier row's entries (a tie at the cut,
// see above) the reference is no longer a function any cache can follow and the check ends there.
TEST_P(V4Fixture, GreedyDecodeMatchesWhileTheReferenceIsLengthStable) {
  Loaded l = load(dir());
  Generator gen(*l.model);
  const int V = l.cfg.vocab_size;
  size_t checked_total = 0;
  for (int i = 0; i < num_prompts(*l.ref); ++i) {
    const std::string s = std::to_string(i);
    const auto prompt = to_ids(ints(*l.ref, "prompt_" + s));
    const auto greedy = to_ids(ints(*l.ref, "greedy_" + s));
    const float* margin = floats(*l.ref, "margin_" + s);
    const size_t n = prompt.size();
    std::vector<int> seq = prompt;
    seq.insert(seq.end(), greedy.begin(), greedy.end() - 1);
    // Prefill the prompt, then feed transformers' tokens one per step.
    const std::vector<float> inc = incremental_logits(*l.model, {seq}, int(n), 1 << 20)[0];
    std::vector<float> prev = gen.prompt_logits(prompt, MlaMode::kAuto);
    size_t k = 0;
    for (; k < greedy.size() && margin[k] >= 1e-3f; ++k) {
      const float* row = inc.data() + (n - 1 + k) * size_t(V);
      ASSERT_LE(rel_l2(row, prev.data() + (n - 1 + k) * size_t(V), V), 1e-5)
          << "prompt " << i << " step " << k;
      ASSERT_EQ(int(std::max_element(row, row + V) - row), greedy[k]) << "prompt " << i << " step " << k;
      if (k + 1 == greedy.size()) {
        ++k;
        break;
      }
      const std::vector<float> next =
          gen.prompt_logits(std::vector<int>(seq.begin(), seq.begin() + long(n + k + 1)), MlaMode::kAuto);
      bool stable = true;
      for (size_t r = 0; r < n + k && stable; ++r)
        stable = rel_l2(next.data() + r * V, prev.data() + r * V, V) <= 1e-6;
      prev = next;
      if (!stable) {
        ++k;
        break;
      }
    }
    std::printf("[v4 greedy] %s prompt %d: %zu of %zu steps checked\n", GetParam().c_str(), i, k,
                greedy.size());
    checked_total += k;
  }
  EXPECT_GT(checked_total, 0u);
}

// Two sequences of different lengths in one batch, one of them split into a cached prefix and a new
// chunk: each sequence's rows equal those of the same sequence run alone.
TEST_P(V4Fixture, BatchedAndChunkedSequencesMatchSingle) {
  Loaded l = load(dir(), {}, kAllEntries);
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

INSTANTIATE_TEST_SUITE_P(Fixtures, V4Fixture,
                         ::testing::Values("dsv4-tiny-hca16", "dsv4-tiny", "dsv4-tiny-fp8"));

// The built-in demo model: four shards and an index; its own reference holds the last rows of logits
// and a greedy continuation for two chat prompts.
TEST(DemoModel, ShardedCheckpointMatchesReference) {
  Loaded l = load(std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp");
  check_logits(l, MlaMode::kAuto);
  check_greedy(l);
}

}  // namespace
}  // namespace beluga
