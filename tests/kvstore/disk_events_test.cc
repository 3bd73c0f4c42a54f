// The file tier's block events (disk_tier.h): a block written to the file tier is reported stored
// (tier disk) under its engine key, and removed when the tier evicts it for room, when its
// retention passes (with an injected clock), and when a load finds its file deleted behind the
// tier's back or corrupt; the log's snapshot (what a router rebuilds its index from) then no longer
// lists it. A block another store sharing the directory wrote is reported once this one loads it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "clocked_store.h"
#include "engine/kv_events.h"
#include "kvstore/block_file.h"
#include "kvstore/fingerprint.h"
#include "kvstore/tiered_store.h"

namespace beluga::kv {
namespace {

namespace fs = std::filesystem;
using testing::kDay;
using testing::kT0;

constexpr size_t kEventBlockBytes = 1500;
const BlockHash kFingerprint{7, 9};
constexpr uint64_t kEpoch = 1;

BlockHash event_key(uint64_t i) {
  return {i * 7919 + 11, ~i};
}

// The blocks the log's snapshot lists in the disk tier.
std::vector<BlockHash> disk_snapshot(const KvEventLog& log) {
  std::vector<BlockHash> v;
  for (const KvEvent& e : log.read(kEpoch + 1, 0, 0).events)  // another epoch: a snapshot
    if (e.tier == KvEventTier::kDisk) v.push_back(e.block);
  return v;
}

bool listed(const std::vector<BlockHash>& v, const BlockHash& k) {
  return std::find(v.begin(), v.end(), k) != v.end();
}

// How many disk events of kind `stored` the log has for block `k` after `after`.
int disk_events(const KvEventLog& log, const BlockHash& k, bool stored, uint64_t after = 0) {
  int n = 0;
  for (const KvEvent& e : log.read(kEpoch, after, 1 << 20).events)
    n += e.tier == KvEventTier::kDisk && e.block == k && e.stored == stored;
  return n;
}

class DiskEvents : public testing::ClockedStore {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path().string() + "/beluga_kv_events_" + std::to_string(::getpid());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // One host slot (a second save pushes the first block down to its file only); `disk_blocks`
  // files at most (0: the file system's free space).
  StoreConfig config(KvEventLog* log, size_t disk_blocks = 0) {
    StoreConfig sc = clocked_config(kEventBlockBytes, kFingerprint, 1);
    sc.disk_dir = dir_;
    sc.disk_bytes = disk_blocks * (kEventBlockBytes + kBlockFileHeaderBytes);
    sc.disk_threads = 1;
    sc.events = log;
    return sc;
  }
  std::string path(TieredStore& st, const BlockHash& k) {
    return st.disk()->path_of(tier_key(k, kFingerprint));
  }
  // Loads `k` through the store (a disk read when the host tier does not hold it): the tokens found.
  static int load(TieredStore& st, const BlockHash& k) {
    int block = 0;
    const auto id = st.start_load(&k, &block, 1, "chat");
    for (int i = 0; i < 5000 && !st.load_ready(id); ++i) ::usleep(1000);
    EXPECT_TRUE(st.load_ready(id));
    std::vector<KvCopy> copies;
    const int got = st.finish_load(id, copies, nullptr);
    st.step_launched();
    st.step_done(true);
    st.drain();
    return got;
  }

  std::string dir_;
};

TEST_F(DiskEvents, EvictionForRoomReportsTheEvictedFilesRemoved) {
  KvEventLog log(1024, kEpoch);
  TieredStore st(config(&log, 4));
  for (uint64_t i = 0; i < 8; ++i) {
    now_ = kT0 + int64_t(i);  // distinct last uses: the oldest files go first
    save(st, event_key(i), "chat");
  }
  const std::vector<BlockHash> snap = disk_snapshot(log);
  ASSERT_GT(st.stats().disk->evictions, 0);
  EXPECT_EQ(int64_t(snap.size()), st.stats().disk->blocks);
  EXPECT_LE(snap.size(), 4u);
  for (uint64_t i = 0; i < 8; ++i) {
    const bool on_disk = fs::exists(path(st, event_key(i)));
    EXPECT_EQ(listed(snap, event_key(i)), on_disk) << i;
    EXPECT_EQ(disk_events(log, event_key(i), true), 1) << i;  // each was written once
    EXPECT_EQ(disk_events(log, event_key(i), false), on_disk ? 0 : 1) << i;
  }
  EXPECT_FALSE(listed(snap, event_key(0))) << "the least recently used file went first";
  EXPECT_TRUE(listed(snap, event_key(7)));
}

TEST_F(DiskEvents, RetentionReportsTheExpiredFilesRemoved) {
  KvEventLog log(1024, kEpoch);
  TieredStore st(config(&log));
  const BlockHash a = event_key(1), b = event_key(2), c = event_key(3);
  save(st, a, "agent");  // 3 days
  save(st, b, "chat");   // 7 days
  save(st, c, "agent");
  ASSERT_EQ(disk_snapshot(log).size(), 3u);
  const uint64_t seq = log.seq();
  now_ = kT0 + 4 * kDay;
  EXPECT_EQ(st.disk()->expire(), 2);  // the periodic sweep
  std::vector<BlockHash> snap = disk_snapshot(log);
  EXPECT_EQ(snap.size(), 1u);
  EXPECT_TRUE(listed(snap, b));
  EXPECT_EQ(disk_events(log, a, false, seq), 1);
  EXPECT_EQ(disk_events(log, c, false, seq), 1);
  // A lookup that finds a block expired removes it too.
  now_ = kT0 + 8 * kDay;
  EXPECT_EQ(st.lookup(&b, 1, nullptr), 0);
  EXPECT_TRUE(disk_snapshot(log).empty());
  EXPECT_EQ(disk_events(log, b, false, seq), 1);
}

TEST_F(DiskEvents, ALoadThatFindsAFileDeletedOrCorruptReportsItRemoved) {
  KvEventLog log(1024, kEpoch);
  TieredStore st(config(&log));
  const BlockHash a = event_key(1), b = event_key(2), c = event_key(3);
  save(st, a, "chat");
  save(st, b, "chat");
  save(st, c, "chat");  // the host tier holds c only
  ASSERT_EQ(disk_snapshot(log).size(), 3u);
  // Another server sharing the directory (or `beluga kv gc`) deletes a's file; b's is damaged.
  ASSERT_TRUE(fs::remove(path(st, a)));
  {
    std::fstream f(path(st, b), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(kBlockFileHeaderBytes + 3));
    f.put('\x33');
    f.put('\x44');
  }
  EXPECT_EQ(disk_snapshot(log).size(), 3u) << "not noticed before a load";
  EXPECT_EQ(load(st, a), 0);
  EXPECT_EQ(load(st, b), 0);
  const std::vector<BlockHash> snap = disk_snapshot(log);
  EXPECT_FALSE(listed(snap, a));
  EXPECT_FALSE(listed(snap, b));
  EXPECT_TRUE(listed(snap, c));
  EXPECT_EQ(disk_events(log, a, false), 1);
  EXPECT_EQ(disk_events(log, b, false), 1);
  EXPECT_FALSE(fs::exists(path(st, b))) << "a corrupt file is removed";
  EXPECT_EQ(st.lookup(&a, 1, nullptr), 0);
}

TEST_F(DiskEvents, ABlockAnotherStoreWroteIsReportedOnceLoaded) {
  const BlockHash a = event_key(1), b = event_key(2);
  {
    TieredStore writer(config(nullptr));  // another replica on the same directory, no events
    save(writer, a, "chat");
    save(writer, b, "chat");
  }
  KvEventLog log(1024, kEpoch);
  TieredStore st(config(&log));
  st.drain();
  EXPECT_TRUE(disk_snapshot(log).empty()) << "the start scan cannot know the engine keys";
  ASSERT_EQ(st.lookup(&a, 1, nullptr), 1);  // as the engine looks before it loads
  ASSERT_EQ(load(st, a), 1);
  std::vector<BlockHash> snap = disk_snapshot(log);
  ASSERT_EQ(snap.size(), 1u);
  EXPECT_TRUE(snap[0] == a);
  // b was never reported here, so neither is its removal.
  ASSERT_TRUE(fs::remove(path(st, b)));
  EXPECT_EQ(load(st, b), 0);
  EXPECT_EQ(disk_events(log, b, false), 0);
  EXPECT_EQ(disk_snapshot(log).size(), 1u);
}

}  // namespace
}  // namespace beluga::kv
