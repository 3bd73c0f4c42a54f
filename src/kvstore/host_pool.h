// HostPool: the host-memory tier. A fixed region of `capacity` blocks of block_bytes each, taken once
// from an allocator (Ops::host_alloc: page-locked on CUDA builds, plain memory on the CPU), holding KV
// blocks by tier key with LRU eviction. A pinned entry (being copied to or from the device) is never
// evicted; a reserved entry is pinned and not findable until published. Not thread-safe: the owner
// (TieredStore) serialises calls.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"

namespace beluga::kv {

struct HostAllocator {
  std::function<void*(size_t)> alloc;  // nullptr when it cannot
  std::function<void(void*)> free;
  static HostAllocator plain();  // 64-byte-aligned heap memory
};

class HostPool {
 public:
  HostPool(size_t capacity_bytes, size_t block_bytes, HostAllocator alloc);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  int capacity() const { return int(slots_.size()); }
  int size() const { return int(index_.size()); }
  size_t block_bytes() const { return block_bytes_; }
  std::byte* data(int slot) { return base_ + size_t(slot) * block_bytes_; }

  // The slot holding `key` (published), or -1. `touch`: it becomes the most recently used.
  int find(const BlockHash& key, bool touch);
  void pin(int slot);
  void unpin(int slot);
  // A pinned, not yet findable slot for `key`, evicting the least recently used unpinned entry when
  // none is free; -1 when every slot is pinned. `evicted` counts an eviction.
  int reserve(const BlockHash& key, bool* evicted = nullptr);
  // Ends a reservation: the slot holds its key's bytes now and becomes findable (unless the key was
  // published meanwhile from elsewhere: then the slot is free again).
  void publish(int slot);
  void drop(int slot);  // ends a reservation that was never filled: the slot is free again

 private:
  struct Slot {
    BlockHash key;
    int pins = 0;
    bool valid = false;  // published
    bool in_lru = false;
    std::list<int>::iterator lru;
  };
  void to_lru_back(int slot);

  size_t block_bytes_;
  HostAllocator alloc_;
  std::byte* base_ = nullptr;
  std::vector<Slot> slots_;
  std::vector<int> free_;
  std::list<int> lru_;  // unpinned published slots; front: evicted first
  std::unordered_map<BlockHash, int, BlockHashHasher> index_;
};

}  // namespace beluga::kv
