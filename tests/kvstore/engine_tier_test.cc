// The engine with a KV tier below its device pool (dsv3-tiny fixture, CPU): a prefix evicted from a
// small device pool is loaded back from the host tier, the greedy output is the cold run's, and the
// loaded tokens count as cached.
#include "../common/tensor_parallel_pair.h"
#include "../engine/engine_test_support.h"
#include "engine/kv_connector.h"
#include "kvstore/tiered_store.h"

#include <unistd.h>

#include <filesystem>

namespace beluga::engine_test {
namespace {

class EngineTier : public EngineTest {
 protected:
  EngineConfig small_pool(KvConnector* kv) const {
    EngineConfig ec;
    ec.num_kv_blocks = 8;  // 512 tokens: the second prompt evicts the first's cached blocks
    ec.max_model_len = 512;
    ec.kv_connector = kv;
    return ec;
  }
  kv::StoreConfig store_config(size_t host_blocks) const {
    kv::StoreConfig sc;
    sc.block_bytes = model_->kv_bytes_per_token() * kKvBlockSize;
    sc.fingerprint = {42, 7};
    sc.host_bytes = host_blocks * sc.block_bytes;
    return sc;
  }
  // Runs the requests one after another; returns each one's tokens.
  std::vector<std::vector<int>> run_in_turn(Engine& e, Collector& c,
                                            const std::vector<std::pair<std::string, std::vector<int>>>& reqs,
                                            int max_tokens) {
    std::vector<std::vector<int>> out;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(e.submit(greedy(reqs[i].first, reqs[i].second, max_tokens, c)), SubmitStatus::kOk);
      EXPECT_TRUE(c.wait(i + 1));
      out.push_back(c.tokens[reqs[i].first][0]);
    }
    wait_idle(e);
    return out;
  }
};

TEST_F(EngineTier, EvictedPrefixIsServedFromHostTier) {
  const std::vector<int> a = prompt(300, 1), b = prompt(420, 2);
  const std::vector<int> want = reference(a, 12);

  // Without a tier the second prompt evicts the first's cached blocks, tail first: its rerun finds
  // only the head block still in the device pool.
  {
    Engine e(*model_, small_pool(nullptr));
    Collector c;
    const auto got = run_in_turn(e, c, {{"a", a}, {"b", b}, {"a2", a}}, 12);
    EXPECT_EQ(got[2], want);
    EXPECT_EQ(c.cached["a2"], kKvBlockSize) << "the device pool should have kept only the prefix's head";
  }
  kv::TieredStore store(store_config(64));
  Engine e(*model_, small_pool(&store));
  Collector c;
  const auto got = run_in_turn(e, c, {{"a", a}, {"b", b}, {"a2", a}}, 12);
  EXPECT_EQ(got[0], want);
  EXPECT_EQ(got[2], want) << "loaded from the host tier: same greedy tokens as the cold run";
  EXPECT_EQ(c.cached["a"], 0);
  EXPECT_EQ(c.cached["a2"], 4 * kKvBlockSize) << "300 tokens: 4 full blocks, the head from the device pool "
                                                 "and the other 3 from the host tier";
  const kv::StoreStats st = store.stats();
  EXPECT_EQ(st.host.hits, 3);
  EXPECT_GE(st.host.bytes_written, int64_t(4 + 6) * int64_t(store_config(0).block_bytes));
  const EngineStats es = e.stats();
  EXPECT_EQ(es.prefix_cache_hits_below, 3 * kKvBlockSize);
  EXPECT_EQ(es.prefix_cache_hits, 4 * kKvBlockSize);
}

// Expert parallelism (two CPU thread ranks, each with its own KV cache) over the host tier: blocks
// loaded from the tier go into every rank's cache, so the rerun's greedy tokens are the single-rank
// reference's (a rank attending over a block it never received would route and combine wrong
// hidden states).
TEST_F(EngineTier, ExpertParallelRanksAllLoadTheTiersBlocks) {
  const std::vector<int> a = prompt(300, 1), b = prompt(420, 2);
  const std::vector<int> want = reference(a, 12);
  ExpertParallelPair pair(cfg_, *ckpt_, 2048);
  Model& rank0 = *pair.model;
  kv::TieredStore store(store_config(64));
  {
    Engine e(rank0, small_pool(&store));
    Collector c;
    const auto got = run_in_turn(e, c, {{"a", a}, {"b", b}, {"a2", a}}, 12);
    EXPECT_EQ(got[0], want);
    EXPECT_EQ(got[2], want) << "loaded from the host tier into both ranks: the reference's tokens";
    EXPECT_EQ(c.cached["a2"], 4 * kKvBlockSize);
    EXPECT_EQ(e.stats().prefix_cache_hits_below, 3 * kKvBlockSize);
  }
}

// Attention data parallel (two CPU thread ranks, each caching only its own sequences' blocks) over
// the host tier: each rank saves the blocks it holds and loads the ones its sequences find in the
// tier. "a" runs on rank 0 and "b" beside it on rank 1; two long prompts then evict their tails from
// both ranks; the reruns find their heads on the ranks that hold them and the rest in the tier, and
// their greedy tokens are one model's (a block saved from, or loaded into, the wrong rank's cache
// would change them).
TEST_F(EngineTier, DataParallelRanksSaveAndLoadTheBlocksTheyHold) {
  const std::vector<int> a = prompt(300, 1), b = prompt(420, 2), e1 = prompt(440, 3), e2 = prompt(440, 4);
  const std::vector<int> want_a = reference(a, 12), want_b = reference(b, 12);
  ExpertParallelPair pair(cfg_, *ckpt_, 2048, {}, true);
  kv::TieredStore store(store_config(64));
  EngineConfig ec = small_pool(&store);  // 8 blocks a rank
  Engine e(*pair.model, ec);
  Collector c;
  const auto pairwise = [&](const std::string& x, const std::vector<int>& px, const std::string& y,
                            const std::vector<int>& py, size_t done) {
    ASSERT_EQ(e.submit(greedy(x, px, 12, c)), SubmitStatus::kOk);
    ASSERT_EQ(e.submit(greedy(y, py, 12, c)), SubmitStatus::kOk);
    ASSERT_TRUE(c.wait(done));
    wait_idle(e);
  };
  pairwise("a", a, "b", b, 2);  // a takes rank 0 (ties go to the first), b the freer rank 1
  pairwise("e1", e1, "e2", e2, 4);
  EXPECT_EQ(c.tokens["a"][0], want_a);
  EXPECT_EQ(c.tokens["b"][0], want_b);
  ASSERT_EQ(e.submit(greedy("a2", a, 12, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(5));
  ASSERT_EQ(e.submit(greedy("b2", b, 12, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(6));
  EXPECT_EQ(c.tokens["a2"][0], want_a) << "a's blocks from the tier into rank 0's cache";
  EXPECT_EQ(c.tokens["b2"][0], want_b) << "b's blocks saved from rank 1's cache and loaded back into it";
  EXPECT_EQ(c.cached["a2"], 4 * kKvBlockSize);
  EXPECT_EQ(c.cached["b2"], 6 * kKvBlockSize);
  EXPECT_GE(store.stats().host.hits, 3 + 5) << "every block but each head came from the tier";
  EXPECT_GE(e.stats().prefix_cache_hits_below, (3 + 5) * kKvBlockSize);
}

// Tensor parallel (qwen3-tiny over two CPU thread ranks, each caching its own KV heads) over the
// host tier: a block's image is rank 0's slice then rank 1's, each saved from and loaded into its
// own rank's cache, so a prefix evicted from the device pool and loaded back decodes to one model's
// greedy tokens (a rank left without its slice, or given the other's, would not).
class TensorParallelTier : public ModelFixture {
 protected:
  void SetUp() override { load_fixture(std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/qwen3-tiny", 2048); }
  std::vector<int> prompt(int n, int seed) const {
    std::vector<int> p(size_t(n), 0);
    for (int i = 0; i < n; ++i) p[size_t(i)] = 2 + (i * 131 + seed * 977) % (cfg_.vocab_size - 2);
    return p;
  }
};

TEST_F(TensorParallelTier, EachRankSavesAndLoadsItsSliceOfABlock) {
  const std::vector<int> a = prompt(300, 1), b = prompt(420, 2);
  GenerateParams g;
  g.max_tokens = 12;
  const std::vector<int> want = Generator(*model_).generate({a}, g)[0];
  test::TensorParallelGroup tp(cfg_, *ckpt_, 2048);
  ASSERT_EQ(tp.model->kv_bytes_per_token() * 2, model_->kv_bytes_per_token());
  kv::StoreConfig sc;
  sc.block_bytes = kv_block_image_bytes(*tp.model, SpecConfig{});
  EXPECT_EQ(sc.block_bytes, model_->kv_bytes_per_token() * kKvBlockSize) << "both ranks' slices";
  sc.fingerprint = {42, 7};
  sc.host_bytes = 64 * sc.block_bytes;
  kv::TieredStore store(sc);
  EngineConfig ec;
  ec.num_kv_blocks = 8;  // a rank: the second prompt evicts the first's cached blocks
  ec.max_model_len = 512;
  ec.kv_connector = &store;
  Engine e(*tp.model, ec);
  Collector c;
  size_t n = 0;
  for (const auto& [id, p] : {std::pair{"a", a}, {"b", b}, {"a2", a}}) {
    EngineRequest r = greedy(id, p, 12, c);
    r.sampling.logprobs = 5;  // the tiny model's greedy tokens hardly depend on the context; these do
    ASSERT_EQ(e.submit(std::move(r)), SubmitStatus::kOk);
    ASSERT_TRUE(c.wait(++n));
  }
  EXPECT_EQ(c.tokens["a"][0], want);
  EXPECT_EQ(c.tokens["a2"][0], want) << "both ranks' slices loaded back from the host tier";
  const auto& cold = c.logprobs["a"][0];
  const auto& warm = c.logprobs["a2"][0];
  ASSERT_EQ(cold.size(), 12u);
  ASSERT_EQ(warm.size(), 12u);
  for (size_t k = 0; k < cold.size(); ++k)
    for (size_t j = 0; j < cold[k].top.size(); ++j)
      EXPECT_NEAR(warm[k].top[j].second, cold[k].top[j].second, 1e-4f)
          << "token " << k << " alternative " << j;
  EXPECT_EQ(c.cached["a2"], 4 * kKvBlockSize);
  EXPECT_EQ(store.stats().host.hits, 3);
  EXPECT_EQ(e.stats().prefix_cache_hits_below, 3 * kKvBlockSize);
}

// Blocks filled by decode steps launched early (before the step ahead of them was applied: their
// commit and saves come once it is) reach the host tier intact: a request that continues the first
// one's output finds those blocks there after the device pool evicted them, and greedy decoding from
// them gives the reference's tokens.
TEST_F(EngineTier, BlocksFilledByEarlyStepsAreSavedIntact) {
  const std::vector<int> a = prompt(40, 5);
  kv::TieredStore store(store_config(64));
  Engine e(*model_, small_pool(&store));
  Collector c;
  const auto first = run_in_turn(e, c, {{"a", a}}, 160);  // positions 40..199: blocks 0-2 filled by decode
  EXPECT_EQ(first[0], reference(a, 160));
  EXPECT_GT(e.stats().steps_early, 100);
  std::vector<int> cont = a;
  cont.insert(cont.end(), first[0].begin(), first[0].begin() + 150);  // 190 tokens: 2 full blocks + 62
  const std::vector<int> evict = prompt(420, 6);
  Collector c2;
  const auto got = run_in_turn(e, c2, {{"evict", evict}, {"cont", cont}}, 8);
  EXPECT_EQ(got[1], reference(cont, 8));
  EXPECT_EQ(c2.cached["cont"], 2 * kKvBlockSize);
  EXPECT_GE(e.stats().prefix_cache_hits_below, kKvBlockSize) << "some of them came from the host tier";
}

// Many requests sharing prefixes through a host tier smaller than their working set, two at a time
// and with n = 2: every output is the reference's (the tier never serves the wrong block).
TEST_F(EngineTier, ConcurrentRequestsThroughASmallTierMatchTheReference) {
  kv::TieredStore store(store_config(6));
  Engine e(*model_, small_pool(&store));
  Collector c;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int> p = prompt(130 + 40 * (i % 3), i % 3);  // three prefixes, shared in pairs
    p.push_back(3 + i);
    prompts.push_back(p);
  }
  auto id = [](int i) {
    std::string s = "r";
    s += std::to_string(i);
    return s;
  };
  for (int i = 0; i < 6; ++i) {
    EngineRequest r = greedy(id(i), prompts[size_t(i)], 6, c);
    if (i == 4) r.sampling.n = 2;
    ASSERT_EQ(e.submit(std::move(r)), SubmitStatus::kOk);
    if (i % 2 == 1) {
      ASSERT_TRUE(c.wait(size_t(i + 1)));
    }
  }
  ASSERT_TRUE(c.wait(6));
  for (int i = 0; i < 6; ++i) {
    const auto want = reference(prompts[size_t(i)], 6);
    EXPECT_EQ(c.tokens[id(i)][0], want) << i;
    if (i == 4) {
      EXPECT_EQ(c.tokens["r4"][1], want);
    }
  }
  EXPECT_EQ(wait_idle(e).kv_blocks_used, 0);
  EXPECT_GT(store.stats().host.hits, 0) << "some prefix came back from the host tier";
  EXPECT_GT(store.stats().host.evictions, 0) << "the tier was full";
}

// A server restarted on its KV directory serves the prefix from the files: the greedy output is the
// cold run's and the prefix counts as cached. Then, with a host tier of 5 blocks, prefixes come back
// from the disk while other requests run.
TEST_F(EngineTier, RestartServesHitsFromTheFileTier) {
  const std::string dir =
      std::filesystem::temp_directory_path().string() + "/beluga_kv_engine_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::vector<int> a = prompt(300, 5);
  const std::vector<int> want = reference(a, 10);
  kv::StoreConfig sc = store_config(16);
  sc.disk_dir = dir;
  {
    kv::TieredStore store(sc);
    Engine e(*model_, small_pool(&store));
    Collector c;
    EXPECT_EQ(run_in_turn(e, c, {{"cold", a}}, 10)[0], want);
    EXPECT_EQ(c.cached["cold"], 0);
    store.drain();
    EXPECT_GE(store.stats().disk->bytes_written, int64_t(4 * sc.block_bytes));
  }
  {
    kv::TieredStore store(sc);  // the restart: empty device pool and host tier
    Engine e(*model_, small_pool(&store));
    Collector c;
    EXPECT_EQ(run_in_turn(e, c, {{"warm", a}}, 10)[0], want);
    EXPECT_EQ(c.cached["warm"], 4 * kKvBlockSize);
    EXPECT_EQ(store.stats().disk->hits, 4);
  }
  {
    kv::StoreConfig tiny = sc;
    tiny.host_bytes = 5 * sc.block_bytes;  // staging for the 4 blocks read back, little more
    kv::TieredStore store(tiny);
    Engine e(*model_, small_pool(&store));
    Collector c;
    const std::vector<int> b = prompt(200, 6);
    ASSERT_EQ(e.submit(greedy("b", b, 40, c)), SubmitStatus::kOk);
    ASSERT_EQ(e.submit(greedy("a", a, 10, c)), SubmitStatus::kOk);
    ASSERT_TRUE(c.wait(2));
    EXPECT_EQ(c.tokens["a"][0], want);
    EXPECT_EQ(c.tokens["b"][0], reference(b, 40));
    EXPECT_EQ(c.cached["a"], 4 * kKvBlockSize);
    EXPECT_EQ(wait_idle(e).kv_blocks_used, 0);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace beluga::engine_test
