// The router's exact cache view and what it feeds: KvIndex (snapshots replace, events apply, tiers
// matched per leading block, file-tier removals end a disk match, a reset or another epoch's events
// force a snapshot, restarts counted), the cost function's tier prices changing the choice, and
// prefill-length buckets (parsing, the bucket of a length, keeping its members).
#include <gtest/gtest.h>

#include <limits>

#include "engine/kv_events.h"
#include "router/bucket.h"
#include "router/kv_index.h"
#include "router/policy.h"
#include "util/error.h"

namespace beluga::router {
namespace {

BlockHash h(uint64_t i) {
  return BlockHash{i + 11, i * 977};
}

std::vector<BlockHash> chain(int n) {
  std::vector<BlockHash> v;
  for (int i = 0; i < n; ++i) v.push_back(h(uint64_t(i)));
  return v;
}

KvEventPage page(uint64_t epoch, uint64_t seq, bool snapshot, std::vector<KvEvent> events) {
  KvEventPage p;
  p.epoch = epoch;
  p.seq = seq;
  p.snapshot = snapshot;
  p.events = std::move(events);
  return p;
}

KvEvent ev(uint64_t block, KvEventTier t, bool stored = true) {
  return KvEvent{0, h(block), t, stored};
}

TEST(RouterKvIndex, FollowsAReplicasLogPageByPage) {
  // The replica's log itself, read page by page as the client does.
  KvEventLog log(1024, 42);
  KvIndex idx(2);
  EXPECT_FALSE(idx.live(0));
  auto sync = [&] {
    for (;;) {
      const auto cur = idx.cursor(0);
      const KvEventPage p = log.read(cur.epoch, cur.seq, 2);
      idx.apply(0, p);
      if (!p.more) return;
    }
  };
  for (uint64_t i = 0; i < 4; ++i) log.stored(KvEventTier::kDevice, h(i));
  sync();
  EXPECT_TRUE(idx.live(0));
  EXPECT_EQ(idx.cursor(0).epoch, 42u);
  EXPECT_EQ(idx.match(0, chain(6)).blocks, 4);
  EXPECT_EQ(idx.match(1, chain(6)).blocks, 0);
  // Block 1 leaves the device for host memory; block 3 leaves entirely.
  log.stored(KvEventTier::kHost, h(1));
  log.removed(KvEventTier::kDevice, h(1));
  log.removed(KvEventTier::kDevice, h(3));
  sync();
  TierMatch m = idx.match(0, chain(6));
  EXPECT_EQ(m.blocks, 3);
  EXPECT_EQ(m.host, 1);
  EXPECT_EQ(m.disk, 0);
  // The chain is walked from its first block: a gap ends the match.
  log.removed(KvEventTier::kDevice, h(0));
  sync();
  EXPECT_EQ(idx.match(0, chain(6)).blocks, 0);
  EXPECT_EQ(idx.blocks(0), 2u);
  EXPECT_EQ(idx.epochs_seen(0), 1u);
}

TEST(RouterKvIndex, FileTierRemovalsEndTheDiskMatch) {
  // A replica's blocks 0-3 left its device and host memory and are files; the file tier then evicts
  // block 2 (or a load found its file gone): the match stops before it, and no longer prices it.
  KvEventLog log(1024, 8);
  KvIndex idx(1);
  for (uint64_t i = 0; i < 4; ++i) {
    log.stored(KvEventTier::kHost, h(i));
    log.stored(KvEventTier::kDisk, h(i));
    log.removed(KvEventTier::kHost, h(i));
  }
  idx.apply(0, log.read(0, 0, 1024));
  TierMatch m = idx.match(0, chain(4));
  EXPECT_EQ(m.blocks, 4);
  EXPECT_EQ(m.disk, 4);
  log.removed(KvEventTier::kDisk, h(2));
  idx.apply(0, log.read(8, idx.cursor(0).seq, 1024));
  m = idx.match(0, chain(4));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(m.disk, 2);
  EXPECT_EQ(idx.blocks(0), 3u);
  // A router that starts now rebuilds the same view from the snapshot.
  KvIndex fresh(1);
  fresh.apply(0, log.read(0, 0, 1024));
  EXPECT_EQ(fresh.match(0, chain(4)).blocks, 2);
  EXPECT_EQ(fresh.blocks(0), 3u);
}

TEST(RouterKvIndex, SnapshotReplacesAndRestartsAreCounted) {
  KvIndex idx(1);
  idx.apply(0, page(5, 3, true, {ev(0, KvEventTier::kDevice), ev(1, KvEventTier::kDisk)}));
  TierMatch m = idx.match(0, chain(3));
  EXPECT_EQ(m.blocks, 2);
  EXPECT_EQ(m.disk, 1);
  // The replica restarted: a snapshot of its new epoch with nothing held.
  idx.apply(0, page(6, 0, true, {}));
  EXPECT_EQ(idx.match(0, chain(3)).blocks, 0);
  EXPECT_EQ(idx.epochs_seen(0), 2u);
  EXPECT_EQ(idx.cursor(0).epoch, 6u);
  // Events of another epoch than the cursor's are not applied; the next read asks for a snapshot.
  idx.apply(0, page(7, 9, false, {ev(0, KvEventTier::kDevice)}));
  EXPECT_EQ(idx.match(0, chain(3)).blocks, 0);
  EXPECT_EQ(idx.cursor(0).epoch, 0u);
}

TEST(RouterKvIndex, ResetForgetsAndWaitsForASnapshot) {
  KvIndex idx(1);
  idx.apply(0, page(5, 1, true, {ev(0, KvEventTier::kDevice)}));
  idx.reset(0);
  EXPECT_FALSE(idx.live(0));
  EXPECT_EQ(idx.match(0, chain(1)).blocks, 0);
  EXPECT_EQ(idx.cursor(0).epoch, 0u);
  // A read that was in flight across the reset brings events: dropped.
  idx.apply(0, page(5, 2, false, {ev(0, KvEventTier::kDevice)}));
  EXPECT_FALSE(idx.live(0));
  idx.apply(0, page(5, 2, true, {ev(0, KvEventTier::kDevice)}));
  EXPECT_TRUE(idx.live(0));
  EXPECT_EQ(idx.match(0, chain(1)).blocks, 1);
  EXPECT_EQ(idx.epochs_seen(0), 1u);  // the same epoch: not a restart
}

TEST(RouterPolicy, TierPricesChangeTheChoice) {
  CostKnobs k;
  k.block_size = 64;
  k.load_cost_tokens = 0;
  // Replica 0 holds 8 blocks of the prompt, all in host memory; replica 1 holds 6 on the device.
  std::vector<Candidate> c(2);
  c[0] = {0, 0, 8};
  c[0].host_blocks = 8;
  c[1] = {1, 0, 6};
  k.host_block_cost = 0;  // loading is free: more blocks win
  Choice ch = choose(Policy::kCacheAware, c, 1000, k, 0);
  EXPECT_EQ(ch.index, 0u);
  EXPECT_DOUBLE_EQ(ch.cost, 1000 - 8 * 64);
  k.host_block_cost = 0.5;  // 8 * 0.5 of a block to load > the 2 blocks more to compute
  ch = choose(Policy::kCacheAware, c, 1000, k, 0);
  EXPECT_EQ(ch.index, 1u);
  EXPECT_EQ(ch.decision, Decision::kSpill);  // passed over the replica with the longer match
  // Disk blocks are priced by their own knob.
  c[0].host_blocks = 0;
  c[0].disk_blocks = 8;
  k.disk_block_cost = 0.1;
  ch = choose(Policy::kCacheAware, c, 1000, k, 0);
  EXPECT_EQ(ch.index, 0u);
  EXPECT_NEAR(ch.cost, 1000 - 8 * 64 + 0.1 * 8 * 64, 1e-9);
}

TEST(RouterBuckets, ParseFindAndKeep) {
  BucketSpec b = parse_bucket("short:16K=http://a:1,b:2");
  EXPECT_EQ(b.name, "short");
  EXPECT_EQ(b.max_tokens, 16 * 1024);
  ASSERT_EQ(b.urls.size(), 2u);
  EXPECT_EQ(b.urls[1], "b:2");
  EXPECT_EQ(parse_bucket("x:1M=h:1").max_tokens, 1024 * 1024);
  EXPECT_EQ(parse_bucket("x:inf=h:1").max_tokens, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(parse_bucket("x:100=h:1").max_tokens, 100);
  for (const char* bad : {"short", "short:16K", ":16K=h:1", "s:zero=h:1", "s:0=h:1", "s:16K=", "s:16Q=h:1"})
    EXPECT_THROW(parse_bucket(bad), Error) << bad;

  Buckets bs;
  bs.add("long", std::numeric_limits<int64_t>::max(), 0b100);
  bs.add("short", 1000, 0b011);
  EXPECT_THROW(bs.add("short", 5, 1), Error);
  EXPECT_EQ(bs.name(bs.find(1)), "short");
  EXPECT_EQ(bs.name(bs.find(1000)), "short");
  EXPECT_EQ(bs.name(bs.find(1001)), "long");

  std::vector<Candidate> c = {{0, 0, 0}, {1, 0, 0}, {2, 0, 0}};
  auto ids = [](const std::vector<Candidate>& v) {
    std::vector<int> r;
    for (const auto& x : v) r.push_back(x.replica);
    return r;
  };
  auto k = c;
  keep_bucket(bs, 10, k);
  EXPECT_EQ(ids(k), (std::vector<int>{0, 1}));
  k = c;
  keep_bucket(bs, 5000, k);
  EXPECT_EQ(ids(k), (std::vector<int>{2}));
  // No member of the bucket is a candidate (ejected, or tried): the others serve.
  k = {{2, 0, 0}};
  keep_bucket(bs, 10, k);
  EXPECT_EQ(ids(k), (std::vector<int>{2}));
  k = c;
  keep_bucket(Buckets(), 10, k);
  EXPECT_EQ(k.size(), 3u);
}

}  // namespace
}  // namespace beluga::router
