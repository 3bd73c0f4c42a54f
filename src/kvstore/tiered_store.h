// TieredStore: the KV connector (engine/kv_connector.h) over the tiers below the device pool: host
// memory (HostPool) and, optionally, files (DiskTier). Blocks are keyed by tier_key(chained block
// hash, model fingerprint).
//
// Saving is write-through: every block a step fills is copied to the host tier right after the step
// computed it (SGLang HiCache's write_through, vLLM's offloading connector), and from there written
// to the file tier on an I/O thread; not when the device pool evicts it (write_back). Eviction from
// the device pool then costs nothing and needs no copy ordered before the block's reuse, and a block
// is on disk soon after it was computed, before a crash or a restart, and visible to the other
// replicas sharing the directory (what retention in days needs). The price is one copy of every
// computed block, deduplicated by key (a block already below is not copied again).
//
// Loads: a block in host memory is copied to the device with the next step; a block only on disk is
// first read into a host slot by an I/O thread (the sequence waits in the scheduler's loading list,
// other requests run on), verified, and becomes a host entry too. Without a host tier, a staging pool
// of kStagingBlocks is used.
//
// Thread-safe: the KvConnector calls come from the engine thread, I/O completions from the disk
// tier's threads, stats() from anywhere.
#pragma once

#include <cstdint>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_connector.h"
#include "engine/kv_events.h"
#include "kvstore/disk_tier.h"
#include "kvstore/host_pool.h"
#include "kvstore/tier_stats.h"

namespace beluga::kv {

// Prompt tokens served from each tier to one traffic class (device: from the engine's own pool, as
// touch() reports it; a preempted sequence admitted again is served again).
struct ClassHits {
  int64_t device = 0, host = 0, disk = 0;
};

struct StoreStats {
  TierStats host;
  std::optional<TierStats> disk;
  std::map<std::string, ClassHits> hit_tokens;       // by traffic class
  std::map<std::string, int64_t> host_class_blocks;  // blocks the host tier holds, by retention class
};

struct StoreConfig {
  size_t block_bytes = 0;  // the model's KV bytes per block
  BlockHash fingerprint;   // kvstore/fingerprint.h
  size_t host_bytes = 0;   // the host tier's capacity (0 with a disk tier: a staging pool only)
  HostAllocator host_alloc = HostAllocator::plain();
  std::string disk_dir;   // empty: no file tier
  size_t disk_bytes = 0;  // 0: the file system's free space
  int disk_threads = 4;
  DiskIoOptions disk_io;         // io_uring or threads, and the sync of block files (block_io.h)
  Retention retention;           // of both tiers' blocks, per traffic class
  std::function<int64_t()> now;  // unix seconds (tests inject a clock); default: the system clock
  // Hears the blocks (by engine key) entering and leaving the host tier and the file tier
  // (engine/kv_events.h); null: none. Not owned; outlives the store. A file is reported once this
  // store wrote or loaded it, and removed when the file tier evicts or expires it or a load finds it
  // gone or bad (disk_tier.h); files only another replica sharing the directory used are not.
  KvEventSink* events = nullptr;
};

class TieredStore final : public KvConnector {
 public:
  static constexpr int kStagingBlocks = 64;

  explicit TieredStore(StoreConfig cfg);
  ~TieredStore() override;

  size_t block_bytes() const override { return cfg_.block_bytes; }
  const BlockHash& fingerprint() const { return cfg_.fingerprint; }
  int lookup(const BlockHash* keys, int n, KvTier* tiers) override;
  LoadId start_load(const BlockHash* keys, const int* blocks, int n, const std::string& cls) override;
  bool load_ready(LoadId id) override;
  int finish_load(LoadId id, std::vector<KvCopy>& copies, KvTier* tiers) override;
  void cancel_load(LoadId id) override;
  std::byte* start_save(const BlockHash& key, const std::string& cls) override;
  void touch(const BlockHash* keys, int n, const std::string& cls) override;
  void step_launched() override;
  void step_done(bool ok) override;

  // Prefill -> decode transfer (kv_transfer.h). The leading blocks of `keys[0..n)` (engine block
  // hashes) found in host memory, pinned (neither evicted nor reused) until the object goes: a sender
  // writes them to its socket straight from their slots, off the engine thread.
  class Pinned {
   public:
    Pinned() = default;
    Pinned(Pinned&& o) noexcept : store_(o.store_), slots_(std::move(o.slots_)), data_(std::move(o.data_)) {
      o.store_ = nullptr;
    }
    Pinned& operator=(Pinned&&) = delete;
    Pinned(const Pinned&) = delete;
    ~Pinned();
    int size() const { return int(data_.size()); }
    const std::byte* data(int i) const { return data_[size_t(i)]; }

   private:
    friend class TieredStore;
    TieredStore* store_ = nullptr;
    std::vector<int> slots_;
    std::vector<const std::byte*> data_;
  };
  Pinned pin_host_blocks(const BlockHash* keys, int n);
  // Receiving a block (engine block hash `key`, retention class `cls`): `dst` is the host slot to
  // write its block_bytes() into, then end_import(slot, ok) publishes it (ok) or frees it. No `dst`
  // when the host tier holds the block already (`held`: it counts as used by `cls`) or every slot is
  // pinned; the caller then drops the bytes.
  struct ImportSlot {
    std::byte* dst = nullptr;
    int slot = -1;
    bool held = false;
  };
  ImportSlot begin_import(const BlockHash& key, const std::string& cls);
  void end_import(int slot, bool ok);

  StoreStats stats() const;
  DiskTier* disk() { return disk_.get(); }
  void drain();  // waits for the disk I/O submitted so far (tests, shutdown)

 private:
  struct Part {
    int slot = -1;           // host slot: pinned (found) or reserved (being read from disk)
    bool from_disk = false;  // read into a reserved slot
    int state = 0;           // disk reads: 0 in flight, 1 ok, -1 failed
  };
  struct Load {
    std::vector<int> blocks;  // device blocks
    std::vector<BlockHash> keys;
    std::vector<Part> parts;           // leading blocks found below
    const std::string* cls = nullptr;  // interned in classes_
    int pending = 0;                   // disk reads in flight
    bool cancelled = false;
  };
  struct StepState {
    std::vector<int> pins;  // host slots read by the step's loads
    struct Save {
      int slot;
      BlockHash key;
      const std::string* cls;  // interned in classes_
    };
    std::vector<Save> saves;  // host slots reserved for its saves
  };
  void end_step(StepState& st, bool ok);
  void release_parts(Load& ld, size_t from);  // mu_ held: ends parts [from, end) of a load
  void on_read(LoadId id, size_t part, bool ok);
  int64_t now() const { return cfg_.now ? cfg_.now() : int64_t(::time(nullptr)); }
  void count_reclaim(HostPool::Reclaimed why);  // mu_ held
  // Block events (cfg_.events set; mu_ held): the engine key of a tier key is remembered from the
  // save or load that brought it, until it leaves the host tier.
  void note_key(const BlockHash& tier, const BlockHash& engine);
  void host_published(const BlockHash& tier);
  void host_removed(const BlockHash& tier);
  void forget_key(const BlockHash& tier);  // a reservation was dropped: unless the key is held
  std::unordered_map<BlockHash, BlockHash, BlockHashHasher> engine_keys_;

  StoreConfig cfg_;
  mutable std::mutex mu_;
  HostPool host_;
  std::unordered_map<LoadId, Load> loads_;
  LoadId next_load_ = 0;
  StepState building_, in_flight_;
  TierStats host_stats_;
  std::map<std::string, ClassHits> hit_tokens_;
  const std::string* intern(const std::string& cls);  // mu_ held
  std::set<std::string> classes_;                     // the classes seen (stable addresses for StepState)
  std::unique_ptr<DiskTier> disk_;  // last: destroyed first, its callbacks use the members above
};

}  // namespace beluga::kv
