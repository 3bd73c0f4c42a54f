// TieredStore's block events (engine/kv_events.h): a block saved to the host tier is reported
// stored there under its engine key (not the tier key) once its step is done, a failed step's saves
// are not, and the block the host tier evicts for a new one is reported removed.
#include <gtest/gtest.h>

#include <cstring>

#include "engine/kv_events.h"
#include "kvstore/tiered_store.h"

namespace beluga::kv {
namespace {

BlockHash step_key(uint64_t i) {
  return {i * 5 + 3, i ^ 0x1234567ull};
}

void save(TieredStore& store, const BlockHash& k, bool ok) {
  std::byte* dst = store.start_save(k, "chat");
  ASSERT_NE(dst, nullptr);
  std::memset(dst, 7, store.block_bytes());
  store.step_launched();
  store.step_done(ok);
}

TEST(TierEvents, HostStoresAndEvictionsUnderEngineKeys) {
  KvEventLog log(64, 1);
  StoreConfig sc;
  sc.block_bytes = 128;
  sc.host_bytes = 2 * 128;
  sc.events = &log;
  sc.now = [] { return int64_t(1000); };
  TieredStore store(std::move(sc));

  save(store, step_key(0), true);
  save(store, step_key(1), false);  // the step failed: nothing was saved
  save(store, step_key(2), true);
  KvEventPage p = log.read(1, 0, 16);
  ASSERT_EQ(p.events.size(), 2u);
  for (const auto& e : p.events) {
    EXPECT_TRUE(e.stored);
    EXPECT_EQ(e.tier, KvEventTier::kHost);
  }
  EXPECT_TRUE(p.events[0].block == step_key(0));
  EXPECT_TRUE(p.events[1].block == step_key(2));

  // A third block evicts the least recently used (key 0).
  save(store, step_key(3), true);
  p = log.read(1, 2, 16);
  ASSERT_EQ(p.events.size(), 2u);
  EXPECT_FALSE(p.events[0].stored);
  EXPECT_TRUE(p.events[0].block == step_key(0));
  EXPECT_TRUE(p.events[1].stored);
  EXPECT_TRUE(p.events[1].block == step_key(3));
  EXPECT_EQ(log.held_blocks(), 2u);
}

}  // namespace
}  // namespace beluga::kv
