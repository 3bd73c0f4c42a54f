// KV block events (engine/kv_events.h, kv_event_json.h): the log's numbering, its dedup of repeated
// stores, a snapshot for a reader of another epoch or one that fell behind the ring, pages cut at
// max_events, the wire form's round trip, and BlockManager's device events (publish, eviction on
// reuse, unpublish).
#include <gtest/gtest.h>

#include <set>

#include "engine/block_manager.h"
#include "engine/kv_event_json.h"
#include "engine/kv_events.h"
#include "model/batch.h"

namespace beluga {
namespace {

BlockHash h(uint64_t i) {
  return BlockHash{i * 3 + 1, i ^ 0xabcdef0123456789ull};
}

TEST(KvEventLog, NumbersEventsAndDropsRepeats) {
  KvEventLog log(16, 7);
  EXPECT_EQ(log.epoch(), 7u);
  log.stored(KvEventTier::kDevice, h(1));
  log.stored(KvEventTier::kDevice, h(1));  // held already: no event
  log.stored(KvEventTier::kHost, h(1));    // another tier: an event
  log.removed(KvEventTier::kDisk, h(1));   // not held there: no event
  log.removed(KvEventTier::kDevice, h(1));
  EXPECT_EQ(log.seq(), 3u);
  EXPECT_EQ(log.held_blocks(), 1u);  // (h1, host)
  const KvEventPage p = log.read(7, 0, 100);
  EXPECT_FALSE(p.snapshot);
  EXPECT_FALSE(p.more);
  EXPECT_EQ(p.seq, 3u);
  ASSERT_EQ(p.events.size(), 3u);
  EXPECT_EQ(p.events[0].seq, 1u);
  EXPECT_TRUE(p.events[0].stored && p.events[0].tier == KvEventTier::kDevice);
  EXPECT_TRUE(p.events[1].stored && p.events[1].tier == KvEventTier::kHost);
  EXPECT_TRUE(!p.events[2].stored && p.events[2].tier == KvEventTier::kDevice && p.events[2].block == h(1));
  // From the middle, and nothing new after the last.
  EXPECT_EQ(log.read(7, 2, 100).events.size(), 1u);
  const KvEventPage none = log.read(7, 3, 100);
  EXPECT_TRUE(none.events.empty());
  EXPECT_FALSE(none.snapshot);
  EXPECT_EQ(none.seq, 3u);
}

TEST(KvEventLog, PagesAreCutAtMaxEvents) {
  KvEventLog log(64, 1);
  for (uint64_t i = 0; i < 10; ++i) log.stored(KvEventTier::kDevice, h(i));
  KvEventPage p = log.read(1, 0, 4);
  EXPECT_EQ(p.events.size(), 4u);
  EXPECT_EQ(p.seq, 4u);
  EXPECT_TRUE(p.more);
  p = log.read(1, 8, 4);
  EXPECT_EQ(p.events.size(), 2u);
  EXPECT_EQ(p.seq, 10u);
  EXPECT_FALSE(p.more);
}

TEST(KvEventLog, SnapshotForAnotherEpochOrAReaderBehindTheRing) {
  KvEventLog log(4, 5);
  for (uint64_t i = 0; i < 6; ++i) log.stored(KvEventTier::kDevice, h(i));
  log.removed(KvEventTier::kDevice, h(0));
  log.stored(KvEventTier::kDisk, h(1));
  // seq 8; the ring holds 5..8. Reading after 4 still works; after 3 lost event 4.
  EXPECT_FALSE(log.read(5, 4, 100).snapshot);
  EXPECT_EQ(log.read(5, 4, 100).events.size(), 4u);
  for (const KvEventPage& p :
       {log.read(5, 3, 100), log.read(0, 0, 100), log.read(6, 8, 100), log.read(5, 99, 100)}) {
    EXPECT_TRUE(p.snapshot);
    EXPECT_EQ(p.epoch, 5u);
    EXPECT_EQ(p.seq, 8u);
    std::set<std::pair<uint64_t, int>> got;
    for (const auto& e : p.events) {
      EXPECT_TRUE(e.stored);
      got.insert({e.block.lo, int(e.tier)});
    }
    std::set<std::pair<uint64_t, int>> want;
    for (uint64_t i = 1; i < 6; ++i) want.insert({h(i).lo, int(KvEventTier::kDevice)});
    want.insert({h(1).lo, int(KvEventTier::kDisk)});
    EXPECT_EQ(got, want);
  }
}

TEST(KvEventLog, RandomEpochsDiffer) {
  KvEventLog a(4), b(4);
  EXPECT_NE(a.epoch(), 0u);
  EXPECT_NE(a.epoch(), b.epoch());
}

TEST(KvEventJson, RoundTrips) {
  KvEventLog log(8, 0xfedcba9876543210ull);
  log.stored(KvEventTier::kHost, h(3));
  log.removed(KvEventTier::kHost, h(3));
  log.stored(KvEventTier::kDisk, BlockHash{~0ull, ~0ull});
  const KvEventPage p = log.read(log.epoch(), 0, 2);
  const auto q = parse_kv_event_page(kv_event_page_json(p));
  ASSERT_TRUE(q);
  EXPECT_EQ(q->epoch, p.epoch);
  EXPECT_EQ(q->seq, 2u);
  EXPECT_TRUE(q->more);
  EXPECT_FALSE(q->snapshot);
  ASSERT_EQ(q->events.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(q->events[i].seq, p.events[i].seq);
    EXPECT_TRUE(q->events[i].block == p.events[i].block);
    EXPECT_EQ(q->events[i].tier, p.events[i].tier);
    EXPECT_EQ(q->events[i].stored, p.events[i].stored);
  }
  const auto s = parse_kv_event_page(kv_event_page_json(log.read(1, 0, 8)));
  ASSERT_TRUE(s);
  EXPECT_TRUE(s->snapshot);
  ASSERT_EQ(s->events.size(), 1u);
  EXPECT_TRUE(s->events[0].block == (BlockHash{~0ull, ~0ull}));
  EXPECT_EQ(block_hash_hex(BlockHash{1, 2}), "00000000000000020000000000000001");
  EXPECT_FALSE(parse_kv_event_page("{}"));
  EXPECT_FALSE(parse_kv_event_page("not json"));
  EXPECT_FALSE(parse_kv_event_page(
      R"({"epoch":"1","seq":1,"snapshot":false,"events":[{"seq":1,"type":"moved","tier":"host","block":"00000000000000020000000000000001"}]})"));
  EXPECT_FALSE(parse_block_hash_hex("123"));
}

TEST(KvEventLog, BlockManagerReportsPublishEvictionAndUnpublish) {
  KvEventLog log(64, 1);
  BlockManager bm(2, true, &log);
  std::vector<int> t(2 * kKvBlockSize);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int(i % 97);
  const auto hashes = block_hashes(t, "k", 2);
  std::vector<int> a;
  ASSERT_TRUE(bm.grow(a, 2 * kKvBlockSize));
  bm.publish(a[0], hashes[0]);
  bm.publish(a[1], hashes[1]);
  bm.release(a);  // free but still cached: no event
  EXPECT_EQ(log.seq(), 2u);
  EXPECT_EQ(log.held_blocks(), 2u);
  // Reusing a cached block evicts it: its removal is reported (the tail goes first).
  std::vector<int> b;
  ASSERT_TRUE(bm.grow(b, 1));
  KvEventPage p = log.read(1, 2, 10);
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_FALSE(p.events[0].stored);
  EXPECT_TRUE(p.events[0].block == hashes[1]);
  // Unpublishing the other (its contents were bad) is reported too.
  std::vector<int> c = bm.acquire_prefix({hashes[0]});
  ASSERT_EQ(c.size(), 1u);
  bm.unpublish(c[0]);
  p = log.read(1, 3, 10);
  ASSERT_EQ(p.events.size(), 1u);
  EXPECT_FALSE(p.events[0].stored);
  EXPECT_TRUE(p.events[0].block == hashes[0]);
  EXPECT_EQ(log.held_blocks(), 0u);
  // A BlockManager without a sink works as before.
  BlockManager plain(2, true);
  std::vector<int> d;
  ASSERT_TRUE(plain.grow(d, 1));
  plain.publish(d[0], hashes[0]);
}

}  // namespace
}  // namespace beluga
