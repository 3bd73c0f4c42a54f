// The host tier: HostPool's LRU and pins, the Ops block copies and TieredStore's save -> load round
// trip (bit-exact), and the model fingerprint.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "backend/cpu/cpu_ops.h"
#include "kv_test_support.h"
#include "kvstore/fingerprint.h"
#include "kvstore/host_pool.h"
#include "kvstore/tiered_store.h"
#include "loader/model_config.h"
#include "model/model.h"
#include "util/file.h"

namespace beluga::kv {
namespace {

using testing::xor_key;

TEST(HostPool, EvictsLeastRecentlyUsedAndNeverPinned) {
  constexpr int64_t t = 1000;
  HostPool pool(3 * 100, 100, HostAllocator::plain());
  ASSERT_EQ(pool.capacity(), 3);
  for (uint64_t i = 0; i < 3; ++i) pool.publish(pool.reserve(xor_key(i), "chat", t));
  EXPECT_EQ(pool.size(), 3);
  pool.use(pool.find(xor_key(0), t), "chat", t);  // 0 becomes the most recent: 1 is the LRU
  pool.pin(pool.find(xor_key(2), t));             // 2 is being copied
  HostPool::Reclaimed why{};
  const int s = pool.reserve(xor_key(3), "chat", t, &why);
  ASSERT_GE(s, 0);
  EXPECT_EQ(why, HostPool::Reclaimed::kEvicted);
  EXPECT_LT(pool.find(xor_key(1), t), 0);  // the LRU went
  pool.publish(s);
  const int s4 = pool.reserve(xor_key(4), "chat", t, &why);  // next LRU: 0 (2 is pinned)
  pool.publish(s4);
  EXPECT_LT(pool.find(xor_key(0), t), 0);
  EXPECT_GE(pool.find(xor_key(2), t), 0);
  // Everything pinned: no slot.
  pool.pin(pool.find(xor_key(3), t));
  pool.pin(pool.find(xor_key(4), t));
  EXPECT_EQ(pool.reserve(xor_key(5), "chat", t), -1);
  // A reservation that is dropped is never findable.
  pool.unpin(pool.find(xor_key(4), t));
  const int s5 = pool.reserve(xor_key(5), "chat", t);
  ASSERT_GE(s5, 0);
  EXPECT_LT(pool.find(xor_key(5), t), 0);
  pool.drop(s5);
  EXPECT_LT(pool.find(xor_key(5), t), 0);
  EXPECT_EQ(pool.expirations(), 0);
}

class HostTier : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv3-tiny";
    cfg_ = ModelConfig::from_file(dir + "/config.json");
    ckpt_ = std::make_unique<Checkpoint>(dir);
    ops_ = std::make_unique<CpuOps>(CpuOptions{1});
    model_ = load_model(cfg_, *ckpt_, *ops_, 512);
    kv_ = model_->make_kv_cache(4);
    block_bytes_ = model_->kv_bytes_per_token() * kKvBlockSize;
  }
  // Fills block `b` of every layer with a pattern that differs per layer and block.
  void fill(int b, uint8_t seed) {
    for (size_t l = 0; l < kv_.layers.size(); ++l) {
      Tensor t = kv_.layers[l].rows(b, b + 1);
      auto* p = static_cast<uint8_t*>(t.data);
      for (size_t i = 0; i < t.nbytes(); ++i) p[i] = uint8_t(i * 31 + l * 7 + seed);
    }
  }
  std::vector<uint8_t> image(int b) {
    std::vector<uint8_t> v(block_bytes_);
    ops_->kv_block_to_host(kv_.layers, b, v.data());
    return v;
  }

  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<CpuOps> ops_;
  std::unique_ptr<Model> model_;
  KvCache kv_;
  size_t block_bytes_ = 0;
};

TEST_F(HostTier, BlockCopiesAreLayerAfterLayer) {
  fill(1, 5);
  const std::vector<uint8_t> img = image(1);
  size_t off = 0;
  for (const Tensor& layer : kv_.layers) {
    const Tensor t = layer.rows(1, 2);
    EXPECT_EQ(std::memcmp(img.data() + off, t.data, t.nbytes()), 0);
    off += t.nbytes();
  }
  EXPECT_EQ(off, block_bytes_);
  ops_->kv_block_from_host(kv_.layers, 3, img.data());
  EXPECT_EQ(image(3), img);
}

TEST_F(HostTier, SaveThenLoadIsBitExact) {
  StoreConfig sc;
  sc.block_bytes = block_bytes_;
  sc.fingerprint = {1, 2};
  sc.host_bytes = 8 * block_bytes_;
  TieredStore store(sc);
  fill(0, 1);
  fill(1, 2);
  const std::vector<uint8_t> want0 = image(0), want1 = image(1);
  // One step saves blocks 0 and 1 (as the runner does: device -> host after the forward).
  const BlockHash k[2] = {xor_key(10), xor_key(11)};
  KvStepCopies step;
  for (int b = 0; b < 2; ++b) step.saves.push_back({b, store.start_save(k[b], "chat")});
  ASSERT_TRUE(step.saves[0].host && step.saves[1].host);
  store.step_launched();
  EXPECT_EQ(store.lookup(k, 2, nullptr), 0) << "not visible before its step is done";
  for (const KvCopy& c : step.saves) ops_->kv_block_to_host(kv_.layers, c.block, c.host);
  store.step_done(true);
  EXPECT_EQ(store.start_save(k[0], "chat"), nullptr) << "stored already: no second copy";
  KvTier tiers[2];
  ASSERT_EQ(store.lookup(k, 2, tiers), 2);
  EXPECT_EQ(tiers[1], KvTier::kHost);
  // Load them into blocks 2 and 3.
  const int dst[2] = {2, 3};
  const auto id = store.start_load(k, dst, 2, "chat");
  ASSERT_TRUE(store.load_ready(id));
  std::vector<KvCopy> copies;
  ASSERT_EQ(store.finish_load(id, copies, nullptr), 2);
  store.step_launched();
  for (const KvCopy& c : copies) ops_->kv_block_from_host(kv_.layers, c.block, c.host);
  store.step_done(true);
  EXPECT_EQ(image(2), want0);
  EXPECT_EQ(image(3), want1);
  const StoreStats st = store.stats();
  EXPECT_EQ(st.host.hits, 2);
  EXPECT_EQ(st.host.bytes_read, int64_t(2 * block_bytes_));
  EXPECT_EQ(st.host.bytes_written, int64_t(2 * block_bytes_));
  // Another model's fingerprint finds nothing.
  sc.fingerprint = {1, 3};
  TieredStore other(sc);
  EXPECT_EQ(other.lookup(k, 2, nullptr), 0);
}

TEST_F(HostTier, FailedStepSavesNothing) {
  StoreConfig sc;
  sc.block_bytes = block_bytes_;
  sc.host_bytes = 2 * block_bytes_;
  TieredStore store(sc);
  const BlockHash k = xor_key(1);
  ASSERT_NE(store.start_save(k, "chat"), nullptr);
  store.step_launched();
  store.step_done(false);
  EXPECT_EQ(store.lookup(&k, 1, nullptr), 0);
  EXPECT_NE(store.start_save(k, "chat"), nullptr) << "the slot is free again";
}

BlockHash fingerprint_of(const std::string& fixture) {
  const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/" + fixture;
  const ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  CpuOps ops(CpuOptions{1});
  Checkpoint ck(dir);
  FingerprintingSource src(ck);
  auto model = load_model(cfg, src, ops, 256);
  return model_fingerprint(read_file(dir + "/config.json"), src.digest(), ops.act_dtype(),
                           model->kv_bytes_per_token(), kKvBlockSize);
}

TEST(Fingerprint, SameModelSameKeyOtherModelsDiffer) {
  const BlockHash a = fingerprint_of("dsv3-tiny");
  EXPECT_EQ(a, fingerprint_of("dsv3-tiny"));
  EXPECT_FALSE(a == fingerprint_of("dsv3-tiny-fp8"));
  EXPECT_FALSE(a == fingerprint_of("qwen3-tiny"));
  const BlockHash b = xor_key(3);
  EXPECT_FALSE(tier_key(b, a) == tier_key(b, fingerprint_of("qwen3-tiny")));
  // The KV layout is part of it.
  EXPECT_FALSE(model_fingerprint("{}", a, DType::kF32, 100, 64) ==
               model_fingerprint("{}", a, DType::kBF16, 100, 64));
}

}  // namespace
}  // namespace beluga::kv
