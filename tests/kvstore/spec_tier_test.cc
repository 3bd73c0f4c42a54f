// Speculative decoding (the demo model's MTP module, CPU) with a host KV tier below a small device
// pool: blocks filled by accepted drafts (published only once verified) reach the tier intact, a
// request continuing the first one's output is served from the tier with the greedy output of an
// engine without speculation, and its drafts are the ones a device-pool hit gives (the block images
// carry the MTP layer's KV).
#include <gtest/gtest.h>

#include <cstring>
#include <memory>

#include "../engine/demo_model_test.h"
#include "engine/block_manager.h"
#include "engine/engine.h"
#include "engine/kv_connector.h"
#include "engine/spec_config.h"
#include "engine/thread_rank_peers.h"
#include "kvstore/tiered_store.h"
#include "parallel/local_communicator.h"
#include "parallel/shard.h"

namespace beluga {
namespace {

using engine_test::Collector;
using engine_test::ExpertParallelPair;

class SpecTier : public engine_test::DemoModelTest {
 protected:
  // K = 2 drafts, every step verifying both (fixed gating: acceptance depends on the drafts alone).
  static EngineConfig config(int blocks, KvConnector* kv, bool speculate = true) {
    EngineConfig ec;
    ec.num_kv_blocks = blocks;
    ec.max_num_seqs = 4;
    ec.max_model_len = 256;
    ec.kv_connector = kv;
    if (speculate)
      ec.speculative = parse_spec_config(R"({"method":"mtp","num_speculative_tokens":2,"gating":"fixed"})");
    return ec;
  }
  kv::StoreConfig store_config(const SpecConfig& spec) const {
    kv::StoreConfig sc;
    sc.block_bytes = kv_block_image_bytes(*model_, spec);
    sc.fingerprint = {42, 7};
    sc.host_bytes = 64 * sc.block_bytes;
    return sc;
  }
  // "a" (190 tokens after its prompt), then "evict", then "cont" on `m` with a 5-block pool over
  // `store`: cont's tokens, cached tokens and what its step verified.
  struct TierRun {
    std::vector<int> a, cont;
    int cached = 0;
    int64_t hits_below = 0, drafts = 0, accepted = 0;
    std::vector<int64_t> per_position;
  };
  TierRun tier_run(Model& m, KvConnector& store, const std::vector<int>& a, const std::vector<int>& evict,
                   const std::vector<int>& cont) {
    TierRun r;
    Collector c;
    Engine e(m, config(5, &store));
    r.a = run(e, c, greedy("a", a, 190, c));
    run(e, c, greedy("evict", evict, 4, c));
    const EngineStats s0 = e.stats();
    r.cont = run(e, c, greedy("cont", cont, 40, c));
    const EngineStats s1 = e.stats();
    r.cached = c.cached["cont"];
    r.hits_below = s1.prefix_cache_hits_below - s0.prefix_cache_hits_below;
    r.drafts = s1.spec_draft_tokens - s0.spec_draft_tokens;
    r.accepted = s1.spec_accepted_tokens - s0.spec_accepted_tokens;
    for (size_t i = 0; i < s1.spec_accepted_per_position.size(); ++i)
      r.per_position.push_back(s1.spec_accepted_per_position[i] - s0.spec_accepted_per_position[i]);
    return r;
  }
  // Submits `r`, waits for it and for the engine to go idle; the tokens it gave.
  static std::vector<int> run(Engine& e, Collector& c, EngineRequest r) {
    const std::string id = r.id;
    size_t before = 0;
    {
      std::lock_guard<std::mutex> lk(c.mu);
      before = c.done.size();
    }
    EXPECT_EQ(e.submit(std::move(r)), SubmitStatus::kOk);
    EXPECT_TRUE(c.wait(before + 1));
    for (int i = 0; i < 2000 && e.stats().kv_blocks_used > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::lock_guard<std::mutex> lk(c.mu);
    return c.tokens[id][0];
  }
};

TEST_F(SpecTier, TheBlockImageCarriesTheMtpLayerOnlyWhenDraftingWithIt) {
  const size_t plain = model_->kv_bytes_per_token() * kKvBlockSize;
  EXPECT_EQ(kv_block_image_bytes(*model_, SpecConfig{}), plain);
  EXPECT_EQ(
      kv_block_image_bytes(*model_, parse_spec_config(R"({"method":"ngram","num_speculative_tokens":2})")),
      plain);
  const SpecConfig mtp = parse_spec_config(R"({"method":"mtp","num_speculative_tokens":2})");
  EXPECT_EQ(kv_block_image_bytes(*model_, mtp), plain / size_t(cfg_.num_layers) * size_t(cfg_.num_layers + 1))
      << "one more layer of the same width";
  // A store sized for the plain image is refused by a speculating engine, with the reason.
  kv::TieredStore store(store_config(SpecConfig{}));
  try {
    Engine e(*model_, config(8, &store));
    ADD_FAILURE() << "an engine drafting with MTP took a store of the plain block image";
  } catch (const std::exception& ex) {
    EXPECT_NE(std::string(ex.what()).find("with the MTP layer"), std::string::npos) << ex.what();
  }
}

// Request "a" decodes 190 tokens after a 40-token prompt: its blocks 0-2 are filled by decode steps
// that verify drafts, so most are published only after verification and saved with the step after.
// A 250-token prompt then evicts them from the 5-block device pool; "cont" (a's prompt and 150 of its
// tokens: two full blocks) finds them in the host tier.
TEST_F(SpecTier, BlocksOfAcceptedDraftsAreSavedAndServeAHit) {
  const SpecConfig spec = config(0, nullptr).speculative;
  const std::vector<int> a = prompt(40, 1), evict = prompt(250, 2);

  // References: no speculation, no tier.
  Collector rc;
  Engine ref(*model_, config(64, nullptr, false));
  const std::vector<int> out = run(ref, rc, greedy("a", a, 190, rc));
  ASSERT_EQ(out.size(), 190u);
  std::vector<int> cont = a;
  cont.insert(cont.end(), out.begin(), out.begin() + 150);
  const std::vector<int> want = run(ref, rc, greedy("cont", cont, 40, rc));

  // Speculation, the prefix kept in a large device pool: its drafts are what "cont" should see.
  Collector dc;
  Engine dev(*model_, config(64, nullptr));
  ASSERT_EQ(run(dev, dc, greedy("a", a, 190, dc)), out);
  const EngineStats d0 = dev.stats();
  EXPECT_EQ(run(dev, dc, greedy("cont", cont, 40, dc)), want);
  const EngineStats d1 = dev.stats();
  EXPECT_EQ(dc.cached["cont"], 2 * kKvBlockSize);
  ASSERT_GT(d1.spec_draft_tokens - d0.spec_draft_tokens, 0);

  kv::TieredStore store(store_config(spec));
  Collector c;
  auto engine = std::make_unique<Engine>(*model_, config(5, &store));
  Engine& e = *engine;
  ASSERT_EQ(run(e, c, greedy("a", a, 190, c)), out) << "speculating with a tier: the same greedy tokens";
  EXPECT_GT(e.stats().spec_accepted_tokens, 0);
  EXPECT_EQ(store.stats().host.blocks, 3) << "blocks 0-2 of a, each saved once it was complete";
  run(e, c, greedy("evict", evict, 4, c));
  const EngineStats s0 = e.stats();
  EXPECT_EQ(run(e, c, greedy("cont", cont, 40, c)), want)
      << "served from the host tier: the reference's tokens";
  const EngineStats s1 = e.stats();
  EXPECT_EQ(c.cached["cont"], 2 * kKvBlockSize);
  EXPECT_GE(s1.prefix_cache_hits_below - s0.prefix_cache_hits_below, kKvBlockSize) << "some from the tier";
  // The loaded blocks brought their MTP KV: the drafts and their acceptance are the device hit's.
  EXPECT_EQ(s1.spec_draft_tokens - s0.spec_draft_tokens, d1.spec_draft_tokens - d0.spec_draft_tokens);
  EXPECT_EQ(s1.spec_accepted_tokens - s0.spec_accepted_tokens,
            d1.spec_accepted_tokens - d0.spec_accepted_tokens);
  EXPECT_EQ(s1.spec_accepted_per_position, [&] {
    std::vector<int64_t> v = s0.spec_accepted_per_position;
    for (size_t i = 0; i < v.size(); ++i)
      v[i] += d1.spec_accepted_per_position[i] - d0.spec_accepted_per_position[i];
    return v;
  }());

  // The saved images end with the MTP layer's slice of the block, written by the MTP passes: not the
  // zeroed cache's, not a copy of the last main layer's.
  engine.reset();  // the store is the test's alone now
  std::vector<int> full = a;
  full.insert(full.end(), out.begin(), out.end());
  const std::vector<BlockHash> keys = block_hashes(full, "", 3);
  const int blocks[3] = {0, 1, 2};
  const kv::StoreConfig sc = store_config(spec);
  const size_t slice = sc.block_bytes / size_t(cfg_.num_layers + 1);
  const KvConnector::LoadId id = store.start_load(keys.data(), blocks, 3, "");
  for (int i = 0; i < 1000 && !store.load_ready(id); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  std::vector<KvCopy> copies;
  ASSERT_EQ(store.finish_load(id, copies, nullptr), 3);
  for (const KvCopy& cp : copies) {
    const std::byte* mtp = cp.host + sc.block_bytes - slice;
    const std::vector<std::byte> zero(slice);
    EXPECT_NE(std::memcmp(mtp, zero.data(), slice), 0) << "block " << cp.block << ": MTP slice never written";
    EXPECT_NE(std::memcmp(mtp, mtp - slice, slice), 0) << "block " << cp.block << ": the last main layer's";
  }
  store.step_launched();
  store.step_done(true);
}

// ThreadRankPeers::copy_blocks writes every layer of a block image into each peer's caches, the
// MTP layer's slice (at the image's end) into its MTP cache.
TEST_F(SpecTier, PeersLoadEveryLayerOfTheImage) {
  const SpecConfig spec = config(0, nullptr).speculative;
  KvCache src = model_->make_kv_cache(4);
  const KvCache src_mtp = model_->make_mtp_kv_cache(4);
  std::vector<Tensor> layers = src.layers;
  layers.insert(layers.end(), src_mtp.layers.begin(), src_mtp.layers.end());
  for (size_t l = 0; l < layers.size(); ++l) {  // block 1 of layer l: l * 1000 + element
    ASSERT_EQ(layers[l].dtype, DType::kF32);
    const int64_t per = layers[l].numel() / 4;
    float* b1 = layers[l].ptr<float>() + per;
    for (int64_t i = 0; i < per; ++i) b1[i] = float(l * 1000) + float(i % 997);
  }
  std::vector<std::byte> image(kv_block_image_bytes(*model_, spec));
  ops_->kv_block_to_host(layers, 1, image.data());
  LocalGroup group(2);
  const ExpertSharding sharding = ExpertSharding::contiguous(cfg_.n_routed_experts, 2);
  ThreadRankPeers peers(cfg_, *ckpt_, model_->max_positions(), group, sharding,
                        cpu_peer_ops(2, CpuOptions{1}));
  const KvBlockCopy copy{2, image.data()};
  EXPECT_EQ(peers.copy_blocks({&copy, 1}, false, 4, true).size(), 1u);  // the caller loads it too
  std::vector<Tensor> got = peers.kv_of(1).layers;
  got.insert(got.end(), peers.mtp_kv_of(1).layers.begin(), peers.mtp_kv_of(1).layers.end());
  ASSERT_EQ(got.size(), layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const int64_t per = layers[l].numel() / 4;
    EXPECT_EQ(std::memcmp(got[l].ptr<float>() + 2 * per, layers[l].ptr<float>() + per, size_t(per) * 4), 0)
        << "layer " << l << (l + 1 == layers.size() ? " (MTP)" : "");
  }
}

// The same on two expert-parallel ranks (each with its own KV and MTP caches): blocks loaded from the
// tier reach every rank's caches, the MTP layer's slice included, so "cont" gives one rank's tokens
// and drafts.
TEST_F(SpecTier, ExpertParallelRanksLoadTheMtpLayerToo) {
  const SpecConfig spec = config(0, nullptr).speculative;
  const std::vector<int> a = prompt(40, 1), evict = prompt(250, 2);
  std::vector<int> cont = a;
  {
    Collector c;
    Engine ref(*model_, config(64, nullptr, false));
    const std::vector<int> out = run(ref, c, greedy("a", a, 190, c));
    cont.insert(cont.end(), out.begin(), out.begin() + 150);
  }
  kv::TieredStore one_store(store_config(spec));
  const TierRun one = tier_run(*model_, one_store, a, evict, cont);
  ASSERT_GT(one.hits_below, 0);

  ExpertParallelPair pair(cfg_, *ckpt_, 1024);
  Model& rank0 = *pair.model;
  kv::TieredStore store(store_config(spec));
  const TierRun two = tier_run(rank0, store, a, evict, cont);
  EXPECT_EQ(two.a, one.a);
  EXPECT_EQ(two.cont, one.cont);
  EXPECT_EQ(two.cached, one.cached);
  EXPECT_EQ(two.hits_below, one.hits_below);
  EXPECT_EQ(two.drafts, one.drafts);
  EXPECT_EQ(two.accepted, one.accepted);
  EXPECT_EQ(two.per_position, one.per_position);
}

}  // namespace
}  // namespace beluga
