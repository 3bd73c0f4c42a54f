// BlockManager: reference counts, the prefix index with per-tenant salts, LRU reuse of freed blocks.
#include <gtest/gtest.h>

#include "engine/block_manager.h"
#include "engine/kv_events.h"
#include "model/batch.h"

namespace beluga {
namespace {

std::vector<int> tokens(int n, int seed) {
  std::vector<int> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7 + seed) % 1000;
  return t;
}

TEST(BlockHashes, ChainNamesTheWholePrefixAndSalt) {
  auto a = tokens(3 * kKvBlockSize + 5, 1);
  auto h = block_hashes(a, "", 10);
  ASSERT_EQ(h.size(), 3u);  // only full blocks
  auto b = a;
  b[0] += 1;  // a change in block 0 changes every later key
  auto hb = block_hashes(b, "", 10);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(h[i] == hb[i]);
  auto hs = block_hashes(a, "tenant-2", 10);
  EXPECT_FALSE(h[0] == hs[0]);
  EXPECT_EQ(block_hashes(a, "", 2).size(), 2u);
  EXPECT_TRUE(block_hashes(a, "", 10)[2] == h[2]);  // deterministic
}

TEST(BlockManager, SharesCachedPrefixesAndCountsReferences) {
  BlockManager bm(8, true);
  auto t = tokens(2 * kKvBlockSize, 3);
  auto h = block_hashes(t, "", 2);
  std::vector<int> a;
  ASSERT_TRUE(bm.grow(a, 2 * kKvBlockSize));
  EXPECT_EQ(bm.num_used(), 2);
  bm.publish(a[0], h[0]);
  bm.publish(a[1], h[1]);
  std::vector<int> b = bm.acquire_prefix(h);
  EXPECT_EQ(b, a);
  EXPECT_EQ(bm.num_used(), 2);  // shared, not copied
  bm.release(a);
  EXPECT_EQ(bm.num_used(), 2);  // b still holds them
  bm.release(b);
  EXPECT_EQ(bm.num_used(), 0);
  // Freed but still cached: a later request finds them again.
  std::vector<int> c = bm.acquire_prefix(h);
  EXPECT_EQ(c.size(), 2u);
  bm.release(c);
}

TEST(BlockManager, ReusesUncachedBlocksFirstThenLeastRecentlyUsed) {
  BlockManager bm(3, true);
  auto t = tokens(kKvBlockSize, 5);
  auto h = block_hashes(t, "", 1);
  std::vector<int> a;
  ASSERT_TRUE(bm.grow(a, kKvBlockSize));
  bm.publish(a[0], h[0]);
  bm.release(a);
  // Two plain blocks are taken before the cached one is evicted.
  std::vector<int> b;
  ASSERT_TRUE(bm.grow(b, 2 * kKvBlockSize));
  EXPECT_EQ(bm.acquire_prefix(h).size(), 1u);
  bm.release(b);
  std::vector<int> c;
  ASSERT_FALSE(bm.grow(c, 4 * kKvBlockSize));  // 3 blocks total
  EXPECT_TRUE(c.empty());
}

TEST(BlockManager, EvictedBlocksLeaveTheIndex) {
  BlockManager bm(1, true);
  auto h = block_hashes(tokens(kKvBlockSize, 9), "", 1);
  std::vector<int> a;
  ASSERT_TRUE(bm.grow(a, 10));
  bm.publish(a[0], h[0]);
  bm.release(a);
  std::vector<int> b;
  ASSERT_TRUE(bm.grow(b, 10));  // the only block: evicts the cached prefix
  bm.release(b);
  EXPECT_TRUE(bm.acquire_prefix(h).empty());
}

TEST(BlockManager, NoSharingWhenCachingIsOff) {
  BlockManager bm(4, false);
  auto h = block_hashes(tokens(kKvBlockSize, 2), "", 1);
  std::vector<int> a;
  ASSERT_TRUE(bm.grow(a, kKvBlockSize));
  bm.publish(a[0], h[0]);
  EXPECT_TRUE(bm.acquire_prefix(h).empty());
}

TEST(BlockManager, UnpublishedBlocksAreNoLongerFoundAndAreReusedFirst) {
  BlockManager bm(4, true);
  auto t = tokens(2 * kKvBlockSize, 5);
  auto h = block_hashes(t, "", 2);
  std::vector<int> a;
  ASSERT_TRUE(bm.grow(a, 2 * kKvBlockSize));
  bm.publish(a[0], h[0]);
  bm.publish(a[1], h[1]);
  const int kept = a[0], dropped = a[1];
  EXPECT_TRUE(bm.is_published(dropped));
  bm.release(a);
  bm.unpublish(dropped);  // freed and cached: becomes a plain free block
  EXPECT_FALSE(bm.is_published(dropped));
  EXPECT_TRUE(bm.is_published(kept));
  std::vector<int> b = bm.acquire_prefix(h);
  EXPECT_EQ(b, std::vector<int>{kept});  // the chain stops at the dropped block
  std::vector<int> c;
  ASSERT_TRUE(bm.grow(c, 1));
  EXPECT_EQ(c[0], dropped);  // no longer worth keeping: reused first
  bm.unpublish(dropped);     // not published: no-op
  bm.release(b);
  bm.release(c);
  EXPECT_EQ(bm.num_used(), 0);
}

// A released prefix is evicted tail first: after its last block's eviction its first blocks are still
// found, so a later request that shares the prefix reuses the head. Evicting the head first (as a
// forward-order release did) would make the whole chain unreachable after a single eviction.
TEST(BlockManager, APrefixsHeadOutlivesItsTail) {
  BlockManager bm(4, true);
  auto t = tokens(4 * kKvBlockSize, 11);
  auto h = block_hashes(t, "", 4);
  std::vector<int> a;
  ASSERT_TRUE(bm.grow(a, 4 * kKvBlockSize));
  for (int i = 0; i < 4; ++i) bm.publish(a[size_t(i)], h[size_t(i)]);
  const std::vector<int> blocks = a;
  bm.release(a);
  // One new block evicts exactly one cached block: the prefix's last.
  std::vector<int> b;
  ASSERT_TRUE(bm.grow(b, 1));
  EXPECT_EQ(b[0], blocks[3]);
  std::vector<int> c = bm.acquire_prefix(h);
  EXPECT_EQ(c, std::vector<int>(blocks.begin(), blocks.begin() + 3));
  bm.release(c);
  bm.release(b);  // a plain block now: reused before any cached one
  // Two more evict the tail of what is left (block 2, then block 1); block 0 survives them.
  std::vector<int> d;
  ASSERT_TRUE(bm.grow(d, 3 * kKvBlockSize));
  EXPECT_EQ(d, (std::vector<int>{blocks[3], blocks[2], blocks[1]}));
  std::vector<int> e = bm.acquire_prefix(h);
  EXPECT_EQ(e, std::vector<int>{blocks[0]});
  bm.release(e);
  bm.release(d);
}

// Partitions (attention data parallelism): a table's blocks all come from one partition; an empty
// table takes the partition with the most free blocks; a cached prefix pulls a sequence into the
// partition holding the longest run of it.
TEST(BlockManager, PartitionsKeepATablesBlocksTogetherAndBalanceNewTables) {
  BlockManager bm(12, true, nullptr, 3);
  ASSERT_EQ(bm.blocks_per_partition(), 4);
  std::vector<int> a, b, c;
  ASSERT_TRUE(bm.grow(a, 2 * kKvBlockSize));  // all free: partition 0
  ASSERT_TRUE(bm.grow(b, 1));                 // 1 and 2 have 4 free: partition 1
  ASSERT_TRUE(bm.grow(c, 1));                 // partition 2
  EXPECT_EQ(bm.partition_of(a[0]), 0);
  EXPECT_EQ(bm.partition_of(b[0]), 1);
  EXPECT_EQ(bm.partition_of(c[0]), 2);
  ASSERT_TRUE(bm.grow(b, 4 * kKvBlockSize));  // b grows in its own partition, to its end
  for (int x : b) EXPECT_EQ(bm.partition_of(x), 1) << x;
  EXPECT_EQ(bm.num_free(1), 0);
  EXPECT_FALSE(bm.grow(b, 5 * kKvBlockSize)) << "the other partitions' free blocks are not b's";
  EXPECT_EQ(b.size(), 4u);
  EXPECT_EQ(bm.num_free(), 2 + 0 + 3);
  std::vector<int> d;
  EXPECT_FALSE(bm.grow(d, 4 * kKvBlockSize)) << "no partition has 4 free blocks";
  EXPECT_TRUE(d.empty());
  ASSERT_TRUE(bm.grow(d, 3 * kKvBlockSize));  // only partition 2 has 3
  for (int x : d) EXPECT_EQ(bm.partition_of(x), 2);
  bm.release(a), bm.release(b), bm.release(c), bm.release(d);
  EXPECT_EQ(bm.num_free(), 12);
}

TEST(BlockManager, APrefixIsFoundInThePartitionHoldingMostOfIt) {
  BlockManager bm(8, true, nullptr, 2);
  const auto t = tokens(3 * kKvBlockSize, 5);
  const auto h = block_hashes(t, "", 3);
  std::vector<int> a, b;
  ASSERT_TRUE(bm.grow(a, 1 * kKvBlockSize));  // partition 0: the first block of the prefix
  bm.publish(a[0], h[0]);
  ASSERT_TRUE(bm.grow(b, 2 * kKvBlockSize));  // partition 1 (more free): the first two
  ASSERT_EQ(bm.partition_of(b[0]), 1);
  bm.publish(b[0], h[0]);
  bm.publish(b[1], h[1]);
  const int a0 = a[0];
  bm.release(a), bm.release(b);
  std::vector<int> c = bm.acquire_prefix(h);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(bm.partition_of(c[0]), 1);
  EXPECT_EQ(bm.partition_of(c[1]), 1);
  ASSERT_TRUE(bm.grow(c, 3 * kKvBlockSize));
  EXPECT_EQ(bm.partition_of(c[2]), 1) << "the rest of the sequence follows its prefix";
  // A one-block prefix is cached in both partitions: equal runs go where more blocks are free.
  EXPECT_EQ(bm.num_free(0), 4);
  EXPECT_EQ(bm.num_free(1), 1);
  std::vector<int> e = bm.acquire_prefix({h[0]});
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], a0);
  bm.release(e), bm.release(c);
}

// A prefix cached in a partition without room for the rest of the sequence is passed over for a
// partition with room (the prefix is recomputed there) rather than holding the request back; when
// no partition has room, the longest run wins.
TEST(BlockManager, APrefixInAFullPartitionYieldsToAPartitionWithRoom) {
  BlockManager bm(8, true, nullptr, 2);  // partitions {0..3}, {4..7}
  const auto h = block_hashes(tokens(2 * kKvBlockSize, 7), "", 2);
  std::vector<int> a, x;
  ASSERT_TRUE(bm.grow(a, 2 * kKvBlockSize));  // partition 0, holding the prefix
  bm.publish(a[0], h[0]);
  bm.publish(a[1], h[1]);
  ASSERT_TRUE(bm.grow(x, 1));  // partition 1 (4 free against 2)
  ASSERT_EQ(bm.partition_of(a[0]), 0);
  ASSERT_EQ(bm.partition_of(x[0]), 1);
  auto where = [&](int blocks) {
    std::vector<int> c = bm.acquire_prefix(h, blocks * kKvBlockSize);
    const std::pair<int, int> got{int(c.size()), c.empty() ? -1 : bm.partition_of(c[0])};
    bm.release(c);
    return got;
  };
  // 4 blocks: 2 more in partition 0 (2 free) fit; partition 1 (3 free) could not hold 4.
  EXPECT_EQ(where(4), std::make_pair(2, 0));
  // 5 blocks fit nowhere: the longest run.
  EXPECT_EQ(where(5), std::make_pair(2, 0));
  ASSERT_TRUE(bm.grow(a, 4 * kKvBlockSize));  // partition 0 full
  // 3 blocks: partition 0 has no room for the third, partition 1 has 3: recomputed there.
  EXPECT_EQ(where(3), std::make_pair(0, -1));
  // 2 blocks: the prefix is all of it, partition 0 fits.
  EXPECT_EQ(where(2), std::make_pair(2, 0));
  // Cached blocks on the free list count once: a released, partition 0 has 4 free, 2 of them the
  // prefix's, so 4 blocks fit there (2 reused, 2 more).
  bm.release(a);
  EXPECT_EQ(where(4), std::make_pair(2, 0));
  EXPECT_EQ(where(5), std::make_pair(2, 0)) << "nowhere: the longest run";
  bm.release(x);
}

struct CountingSink : KvEventSink {
  int stored_n = 0, removed_n = 0;
  void stored(KvEventTier, const BlockHash&) override { ++stored_n; }
  void removed(KvEventTier, const BlockHash&) override { ++removed_n; }
};

TEST(BlockManager, AKeyCachedInTwoPartitionsIsOneEvent) {
  CountingSink sink;
  BlockManager bm(4, true, &sink, 2);
  const auto h = block_hashes(tokens(kKvBlockSize, 9), "", 1);
  std::vector<int> a, b;
  ASSERT_TRUE(bm.grow(a, 1));
  ASSERT_TRUE(bm.grow(b, 1));
  ASSERT_NE(bm.partition_of(a[0]), bm.partition_of(b[0]));
  bm.publish(a[0], h[0]);
  bm.publish(b[0], h[0]);
  EXPECT_EQ(sink.stored_n, 1);
  bm.unpublish(a[0]);
  EXPECT_EQ(sink.removed_n, 0) << "partition " << bm.partition_of(b[0]) << " still holds it";
  bm.unpublish(b[0]);
  EXPECT_EQ(sink.removed_n, 1);
  bm.release(a), bm.release(b);
}

}  // namespace
}  // namespace beluga
