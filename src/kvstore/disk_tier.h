// DiskTier: the file tier on any POSIX directory (a local SSD, or NFS/CephFS/Lustre/3FS mounted on
// every host). One file per block (block_file.h), at DIR/<fingerprint>/<2 hex digits>/<key>.kvb: a
// DeepSeek block is 0.5-4.5 MiB (V2-Lite BF16 2 MiB, V3 4.3 MiB), so a file per block is already in
// the range where file systems stream well and no grouping is needed.
//
// The index (key -> size, class, last use) is rebuilt by a background scan at start, so a restart
// serves hits at once: a key the index does not know is looked for on disk (one stat), which is also
// how a server sees blocks another server sharing the directory wrote. Reads and writes run on a
// BlockIo (block_io.h: io_uring where the kernel allows it, else a thread pool; cfg.io says which and
// how block files are synced before their rename); a failed read (missing, truncated, corrupt, foreign: the
// file is removed) or write (full disk, I/O error) is a miss or a dropped save, counted, never an error to
// the request. Capacity: `capacity_bytes` (0: the store's size plus the file system's free space at start);
// beyond it the least recently used files go. A write the file system refuses for lack of space (ENOSPC,
// EDQUOT) lowers the capacity to what the tier holds plus the space free then, so later writes make
// room by eviction; temporary files of writers killed mid-write are removed by the scan.
//
// Block events (cfg.events): a block is reported stored (tier disk) under the engine key its write or
// read named (`report_as`) once it is in the index, and removed when it leaves the index for any reason —
// eviction, retention, or a read that found its file gone (another server or `beluga kv gc` deleted it),
// truncated, corrupt or foreign. Blocks the start scan or a stat found but that no write or read named
// are not reported (their engine key is unknown: the file holds the tier key only). Events are emitted
// with mu_ held, so a block's stored and removed reach the sink in the order the index saw them.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "engine/block_manager.h"
#include "engine/kv_events.h"
#include "kvstore/block_io.h"
#include "kvstore/retention.h"
#include "kvstore/tier_stats.h"

namespace beluga::kv {

struct DiskConfig {
  std::string dir;
  size_t capacity_bytes = 0;  // 0: from the file system's free space
  BlockHash fingerprint;
  size_t block_bytes = 0;
  int threads = 4;   // the thread path's I/O threads
  DiskIoOptions io;  // the I/O path and the sync of block files
  Retention retention;
  std::function<int64_t()> now;   // unix seconds; default: the system clock
  KvEventSink* events = nullptr;  // null: no events; not owned, outlives the tier
};

class DiskTier {
 public:
  explicit DiskTier(DiskConfig cfg);
  ~DiskTier();  // finishes the I/O in flight (its callbacks run), stops the scan
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Whether block `key` is in the tier (the index, else a stat of its file) and not expired. Any thread.
  bool contains(const BlockHash& key);
  // Reads and verifies block `key` into `dst` (block_bytes) on an I/O thread, then calls done(ok);
  // a hit is a use by class `cls`, and reports the block under `report_as` (its engine key) if not yet.
  void read(const BlockHash& key, std::byte* dst, const std::string& cls, std::function<void(bool ok)> done,
            std::optional<BlockHash> report_as = std::nullopt);
  // Block `key` (if here) is used now by class `cls`: its last use moves, and its class becomes cls
  // when cls keeps blocks longer (a block shared by several classes keeps the longest retention).
  void touch(const BlockHash& key, const std::string& cls);
  // Removes the blocks whose class's retention has passed since their last use; returns how many.
  int64_t expire();
  struct ClassUsage {
    int64_t blocks = 0, bytes = 0;
  };
  std::map<std::string, ClassUsage> by_class() const;
  // Writes block `key` from `src` unless it is there already, on an I/O thread; then done() (always).
  // The block, once there (written now or before), is reported under `report_as` if not yet.
  void write(const BlockHash& key, const std::byte* src, const std::string& cls, std::function<void()> done,
             std::optional<BlockHash> report_as = std::nullopt);

  void drain() { io_->drain(); }  // waits for the I/O submitted so far
  // The I/O path in use, and why when io_uring was asked for (auto) but not taken.
  const std::string& io_description() const { return io_->description(); }
  bool io_uring() const { return io_->uring(); }
  bool scan_done() const { return scan_done_; }
  TierStats stats() const;
  std::string path_of(const BlockHash& key) const;
  size_t capacity_bytes() const { return capacity_; }

 private:
  struct Entry {
    uint64_t bytes = 0;
    int64_t last_used = 0;
    int64_t persisted_use = 0;  // the last use the file's mtime says
    std::string cls;
    std::optional<BlockHash> reported;  // the engine key it was reported stored under (cfg_.events)
  };
  bool expired(const Entry& e, int64_t t) const { return t - e.last_used > cfg_.retention.of(e.cls); }
  // mu_ held: an expired entry whose file another server has used since stays (with that use);
  // otherwise its file goes. True when it went.
  bool expire_one(const BlockHash& key, Entry& e, int64_t t);
  void touch_locked(const BlockHash& key, const std::string& cls);  // mu_ held
  void scan();
  void add(const BlockHash& key, uint64_t bytes, int64_t last_used, const std::string& cls);  // mu_ held
  void forget(const BlockHash& key);                                          // mu_ held; reports it removed
  void report(const BlockHash& key, const std::optional<BlockHash>& engine);  // mu_ held: if in the index
  void make_room(uint64_t incoming);                                          // mu_ held: evicts LRU files
  void shrink_to_free_space();                                                // mu_ held: after ENOSPC
  int64_t now() const { return cfg_.now ? cfg_.now() : int64_t(::time(nullptr)); }

  DiskConfig cfg_;
  std::string root_;  // DIR/<fingerprint>
  size_t capacity_ = 0;
  bool capacity_from_free_ = false;
  mutable std::mutex mu_;
  std::unordered_map<BlockHash, Entry, BlockHashHasher> index_;
  std::unordered_set<BlockHash, BlockHashHasher> writing_;
  uint64_t bytes_ = 0;
  uint64_t writing_bytes_ = 0;  // of the writes in flight, which make_room counts as held
  int64_t last_expire_ = 0;
  TierStats stats_;
  std::atomic<bool> stop_{false}, scan_done_{false};
  std::unique_ptr<BlockIo> io_;
  std::thread scanner_;
};

}  // namespace beluga::kv
