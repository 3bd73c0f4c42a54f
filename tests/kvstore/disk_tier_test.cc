// The file tier: block files round trip; truncated, corrupt and foreign files are misses and are
// removed; a store restarted on its directory, or a second store sharing it, serves the blocks; a full
// disk (a small tmpfs) drops saves and keeps serving.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "kv_test_support.h"
#include "kvstore/block_file.h"
#include "kvstore/disk_tier.h"
#include "kvstore/fingerprint.h"
#include "kvstore/tiered_store.h"

namespace beluga::kv {
namespace {

namespace fs = std::filesystem;

constexpr size_t kDiskBlockBytes = 3000;

using testing::key;
using testing::pattern;

StoreConfig disk_store(const std::string& dir, size_t host_blocks = 16) {
  StoreConfig sc;
  sc.block_bytes = kDiskBlockBytes;
  sc.fingerprint = {11, 22};
  sc.host_bytes = host_blocks * kDiskBlockBytes;
  sc.disk_dir = dir;
  sc.disk_threads = 2;
  return sc;
}

// Saves `data` as the blocks keys[0..n) the way the engine does (a step's save copies).
void save(TieredStore& st, const std::vector<BlockHash>& keys,
          const std::vector<std::vector<std::byte>>& data, const std::string& cls = "chat") {
  std::vector<std::byte*> dst;
  for (const auto& k : keys) dst.push_back(st.start_save(k, cls));
  st.step_launched();
  for (size_t i = 0; i < keys.size(); ++i)
    if (dst[i]) std::memcpy(dst[i], data[i].data(), kDiskBlockBytes);
  st.step_done(true);
  st.drain();
}

// Loads keys[0..n) (waiting for the disk) and returns the bytes of the blocks found.
std::vector<std::vector<std::byte>> load(TieredStore& st, const std::vector<BlockHash>& keys,
                                         const std::string& cls = "chat") {
  std::vector<int> blocks(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) blocks[i] = int(i);
  const auto id = st.start_load(keys.data(), blocks.data(), int(keys.size()), cls);
  for (int i = 0; i < 5000 && !st.load_ready(id); ++i) ::usleep(1000);
  EXPECT_TRUE(st.load_ready(id));
  std::vector<KvCopy> copies;
  st.finish_load(id, copies, nullptr);
  std::vector<std::vector<std::byte>> out;
  for (const KvCopy& c : copies) out.emplace_back(c.host, c.host + kDiskBlockBytes);
  st.step_launched();
  st.step_done(true);
  return out;
}

TEST(BlockFile, RoundTripAndRejections) {
  const std::string dir = testing::temp_dir("kv", "file");
  const std::string path = dir + "/a.kvb";
  BlockFileHeader h;
  h.fingerprint = {1, 2};
  h.key = key(1);
  h.tokens = 64;
  h.cls = "agent";
  h.created = h.last_used = 1700000000;
  h.payload_bytes = kDiskBlockBytes;
  const auto data = pattern(1, kDiskBlockBytes);
  ASSERT_EQ(write_block_file(path, h, data.data()), BlockFileStatus::kOk);
  std::vector<std::byte> got(kDiskBlockBytes);
  BlockFileHeader r;
  ASSERT_EQ(read_block_file(path, h.fingerprint, h.key, kDiskBlockBytes, got.data(), &r),
            BlockFileStatus::kOk);
  EXPECT_EQ(got, data);
  EXPECT_EQ(r.cls, "agent");
  EXPECT_EQ(r.created, 1700000000);
  EXPECT_EQ(read_block_file(path, {1, 3}, h.key, kDiskBlockBytes, got.data(), &r), BlockFileStatus::kForeign);
  EXPECT_EQ(read_block_file(path, h.fingerprint, key(2), kDiskBlockBytes, got.data(), &r),
            BlockFileStatus::kCorrupt);
  {  // one payload byte flipped
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(kBlockFileHeaderBytes + 100));
    f.put(char(~char(data[100])));
  }
  EXPECT_EQ(read_block_file(path, h.fingerprint, h.key, kDiskBlockBytes, got.data(), &r),
            BlockFileStatus::kCorrupt);
  ASSERT_EQ(write_block_file(path, h, data.data()), BlockFileStatus::kOk);
  fs::resize_file(path, kBlockFileHeaderBytes + kDiskBlockBytes - 1);
  EXPECT_EQ(read_block_file(path, h.fingerprint, h.key, kDiskBlockBytes, got.data(), &r),
            BlockFileStatus::kShort);
  fs::resize_file(path, 10);
  EXPECT_EQ(read_block_file(path, h.fingerprint, h.key, kDiskBlockBytes, got.data(), &r),
            BlockFileStatus::kShort);
  // No temporary files are left behind.
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);
  fs::remove_all(dir);
}

TEST(DiskTier, RestartServesTheBlocksBitExact) {
  const std::string dir = testing::temp_dir("kv", "restart");
  std::vector<BlockHash> keys = {key(1), key(2), key(3)};
  std::vector<std::vector<std::byte>> data = {pattern(1, kDiskBlockBytes), pattern(2, kDiskBlockBytes),
                                              pattern(3, kDiskBlockBytes)};
  {
    TieredStore st(disk_store(dir));
    save(st, keys, data);
    ASSERT_TRUE(st.stats().disk);
    EXPECT_EQ(st.stats().disk->bytes_written, int64_t(3 * kDiskBlockBytes));
  }
  TieredStore st(disk_store(dir));  // a fresh host tier: only the files know these blocks
  KvTier tiers[3];
  ASSERT_EQ(st.lookup(keys.data(), 3, tiers), 3);
  EXPECT_EQ(tiers[0], KvTier::kDisk);
  EXPECT_EQ(load(st, keys), data);
  EXPECT_EQ(st.stats().disk->hits, 3);
  // Now promoted to the host tier.
  ASSERT_EQ(st.lookup(keys.data(), 3, tiers), 3);
  EXPECT_EQ(tiers[2], KvTier::kHost);
  for (int i = 0; i < 200 && !st.disk()->scan_done(); ++i) ::usleep(5000);
  EXPECT_TRUE(st.disk()->scan_done());
  EXPECT_EQ(st.stats().disk->blocks, 3);
  fs::remove_all(dir);
}

TEST(DiskTier, TwoStoresShareOneDirectory) {
  const std::string dir = testing::temp_dir("kv", "shared");
  TieredStore a(disk_store(dir)), b(disk_store(dir));
  for (int i = 0; i < 200 && !b.disk()->scan_done(); ++i) ::usleep(5000);
  const std::vector<BlockHash> keys = {key(7), key(8)};
  const std::vector<std::vector<std::byte>> data = {pattern(7, kDiskBlockBytes), pattern(8, kDiskBlockBytes)};
  save(a, keys, data);
  ASSERT_EQ(b.lookup(keys.data(), 2, nullptr), 2) << "b sees a's blocks after its own scan finished";
  EXPECT_EQ(load(b, keys), data);
  // Another model on the same directory sees nothing.
  StoreConfig other = disk_store(dir);
  other.fingerprint = {11, 23};
  TieredStore c(other);
  EXPECT_EQ(c.lookup(keys.data(), 2, nullptr), 0);
  fs::remove_all(dir);
}

TEST(DiskTier, BadFilesAreMissesAndRemoved) {
  const std::string dir = testing::temp_dir("kv", "bad");
  const std::vector<BlockHash> keys = {key(1), key(2), key(3), key(4)};
  const std::vector<std::vector<std::byte>> data = {pattern(1, kDiskBlockBytes), pattern(2, kDiskBlockBytes),
                                                    pattern(3, kDiskBlockBytes), pattern(4, kDiskBlockBytes)};
  std::string paths[4];
  {
    TieredStore st(disk_store(dir));
    save(st, keys, data);
    for (int i = 0; i < 4; ++i) paths[i] = st.disk()->path_of(tier_key(keys[size_t(i)], {11, 22}));
  }
  for (const auto& p : paths) ASSERT_TRUE(fs::exists(p)) << p;
  {  // block 2: a payload byte flipped
    std::fstream f(paths[1], std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(std::streamoff(kBlockFileHeaderBytes + 7));
    f.put('\x5a' ^ char(data[1][7]));
  }
  fs::resize_file(paths[2], kBlockFileHeaderBytes + 10);  // block 3: truncated
  {                                                       // block 4: another model's file under this name
    BlockFileHeader h;
    h.fingerprint = {99, 99};
    h.key = tier_key(keys[3], {11, 22});
    h.payload_bytes = kDiskBlockBytes;
    ASSERT_EQ(write_block_file(paths[3], h, data[3].data()), BlockFileStatus::kOk);
  }
  TieredStore st(disk_store(dir));
  st.drain();
  // Block 1 loads; block 2 is corrupt: the load ends there, and its file is gone.
  const auto got = load(st, {keys[0], keys[1]});
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], data[0]);
  EXPECT_FALSE(fs::exists(paths[1]));
  EXPECT_TRUE(load(st, {keys[2]}).empty());
  EXPECT_TRUE(load(st, {keys[3]}).empty());
  EXPECT_FALSE(fs::exists(paths[3]));
  EXPECT_FALSE(fs::exists(paths[2]));  // truncated: removed by the scan or the read
  EXPECT_GE(st.stats().disk->errors, 2);
  EXPECT_EQ(st.lookup(&keys[1], 1, nullptr), 0);
  fs::remove_all(dir);
}

// A full file system: a 64 KiB tmpfs when this process may mount one (root), else writes capped by
// RLIMIT_FSIZE (each block file fails with EFBIG, SIGXFSZ ignored): a quota-free simulation.
TEST(DiskTier, FullDiskDropsSavesAndKeepsServing) {
  const std::string dir = testing::temp_dir("kv", "full");
  const bool mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") == 0;
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  if (!mounted) {
    std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = old;
    lim.rlim_cur = kDiskBlockBytes;  // smaller than any block file
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  }
  std::printf("full disk: %s\n", mounted ? "64 KiB tmpfs" : "RLIMIT_FSIZE simulation");
  {
    StoreConfig sc = disk_store(dir, 4);
    sc.disk_bytes = size_t(1) << 30;  // the tier believes it has room: the file system says no
    TieredStore st(sc);
    std::vector<BlockHash> keys;
    std::vector<std::vector<std::byte>> data;
    for (int i = 0; i < 40; ++i) {
      keys.push_back(key(uint64_t(100 + i)));
      data.push_back(pattern(100 + i, kDiskBlockBytes));
    }
    for (size_t i = 0; i < keys.size(); i += 4)  // a step at a time: the host tier holds 4 blocks
      save(st, {keys.begin() + int64_t(i), keys.begin() + int64_t(i + 4)},
           {data.begin() + int64_t(i), data.begin() + int64_t(i + 4)});
    const TierStats d = *st.stats().disk;
    EXPECT_GT(d.errors, 0) << "some writes hit the full disk";
    if (mounted) {
      EXPECT_GT(d.bytes_written, 0) << "the first blocks fit";
    }
    // Serving goes on: the last blocks are still in the host tier, and whatever made it to disk loads.
    const std::vector<BlockHash> last = {keys[36], keys[37], keys[38], keys[39]};
    EXPECT_EQ(load(st, last).size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      const auto one = load(st, {keys[i]});
      if (!one.empty()) {
        EXPECT_EQ(one[0], data[i]);
      }
    }
    // No temporary file is left behind.
    for (auto& e : fs::recursive_directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
  if (mounted)
    ::umount(dir.c_str());
  else
    ::setrlimit(RLIMIT_FSIZE, &old);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace beluga::kv
