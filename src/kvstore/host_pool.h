// HostPool: the host-memory tier. A fixed region of `capacity` blocks of block_bytes each, taken once
// from an allocator (Ops::host_alloc: page-locked on CUDA builds, plain memory on the CPU), holding KV
// blocks by tier key. Retention per traffic class as the file tier keeps it (retention.h): an entry
// whose class's retention has passed since its last use is a miss and goes; within capacity,
// eviction takes expired entries first, then the least recently used. A block used by several
// classes keeps the longest retention. A pinned entry (being copied to or from the device) is never
// evicted; a reserved entry is pinned and not findable until published. Not thread-safe: the owner
// (TieredStore) serialises calls. Times are unix seconds given by the caller (tests inject a clock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "kvstore/retention.h"

namespace beluga::kv {

struct HostAllocator {
  std::function<void*(size_t)> alloc;  // nullptr when it cannot
  std::function<void(void*)> free;
  static HostAllocator plain();  // 64-byte-aligned heap memory
};

class HostPool {
 public:
  HostPool(size_t capacity_bytes, size_t block_bytes, HostAllocator alloc, Retention retention = Retention());
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  int capacity() const { return int(slots_.size()); }
  int size() const { return int(index_.size()); }
  size_t block_bytes() const { return block_bytes_; }
  std::byte* data(int slot) { return base_ + size_t(slot) * block_bytes_; }

  // The slot holding `key` (published, not expired at `now`), or -1. An expired entry nobody is
  // copying goes (an expiration).
  int find(const BlockHash& key, int64_t now);
  // The entry in `slot` is used now by class `cls`: it becomes the most recently used, and takes
  // cls when cls keeps blocks longer.
  void use(int slot, const std::string& cls, int64_t now);
  void pin(int slot);
  void unpin(int slot);
  enum class Reclaimed { kNone, kEvicted, kExpired };
  // A pinned, not yet findable slot for `key` of class `cls`, taking a free slot, else an expired
  // entry, else the least recently used unpinned one; -1 when every slot is pinned. `why` says what
  // it took the slot from.
  int reserve(const BlockHash& key, const std::string& cls, int64_t now, Reclaimed* why = nullptr);
  // Ends a reservation: the slot holds its key's bytes now and becomes findable (unless the key was
  // published meanwhile from elsewhere: then the slot is free again). Returns the slot that holds
  // the key now.
  int publish(int slot);
  void drop(int slot);  // ends a reservation that was never filled: the slot is free again
  // Drops the entries past their retention at `now` (the oldest of each class first); returns how many.
  int64_t expire(int64_t now);
  int64_t expirations() const { return expirations_; }
  std::map<std::string, int64_t> blocks_by_class() const;  // published entries per class
  // Called with the key of every published entry that leaves (evicted, expired); for block events.
  void set_on_remove(std::function<void(const BlockHash& key)> f) { on_remove_ = std::move(f); }

 private:
  struct Slot {
    BlockHash key;
    int pins = 0;
    bool valid = false;  // published
    bool in_lru = false;
    int cls = 0;  // index into classes_
    int64_t last_used = 0;
    std::list<int>::iterator lru;
  };
  int class_id(const std::string& cls);
  bool expired(const Slot& s, int64_t now) const { return now - s.last_used > class_ret_[size_t(s.cls)]; }
  void to_lru_back(int slot);
  void unlink_lru(int slot);
  void remove_entry(int slot);  // an unpinned published entry: freed

  size_t block_bytes_;
  HostAllocator alloc_;
  Retention retention_;
  std::byte* base_ = nullptr;
  std::vector<Slot> slots_;
  std::vector<int> free_;
  // Per class, its unpinned published slots in order of use; front: the least recently used.
  std::deque<std::list<int>> lru_;  // (a deque: growing it moves no list)
  std::vector<std::string> classes_;
  std::vector<int64_t> class_ret_;  // the retention of each class, seconds
  std::unordered_map<BlockHash, int, BlockHashHasher> index_;
  int64_t expirations_ = 0;
  std::function<void(const BlockHash&)> on_remove_;
};

}  // namespace beluga::kv
