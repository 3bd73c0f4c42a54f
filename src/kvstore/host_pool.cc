#include "kvstore/host_pool.h"

#include <cstdlib>

#include "util/error.h"

namespace beluga::kv {

HostAllocator HostAllocator::plain() {
  return {[](size_t n) { return std::aligned_alloc(64, (n + 63) / 64 * 64); }, [](void* p) { std::free(p); }};
}

HostPool::HostPool(size_t capacity_bytes, size_t block_bytes, HostAllocator alloc)
    : block_bytes_(block_bytes), alloc_(std::move(alloc)) {
  BELUGA_CHECK(block_bytes > 0, "host KV pool: zero-byte blocks");
  const size_t n = capacity_bytes / block_bytes;
  BELUGA_CHECK(n > 0, "the host KV tier of ", capacity_bytes, " bytes holds no block of ", block_bytes,
               " bytes; give it more memory");
  base_ = static_cast<std::byte*>(alloc_.alloc(n * block_bytes));
  BELUGA_CHECK(base_, "cannot allocate ", n * block_bytes, " bytes of host memory for the KV tier");
  slots_.resize(n);
  free_.reserve(n);
  for (size_t i = n; i-- > 0;) free_.push_back(int(i));
  index_.reserve(n);
}

HostPool::~HostPool() {
  alloc_.free(base_);
}

void HostPool::to_lru_back(int slot) {
  Slot& s = slots_[size_t(slot)];
  if (s.in_lru) lru_.erase(s.lru);
  s.lru = lru_.insert(lru_.end(), slot);
  s.in_lru = true;
}

int HostPool::find(const BlockHash& key, bool touch) {
  auto it = index_.find(key);
  if (it == index_.end()) return -1;
  if (touch && slots_[size_t(it->second)].in_lru) to_lru_back(it->second);
  return it->second;
}

void HostPool::pin(int slot) {
  Slot& s = slots_[size_t(slot)];
  if (s.pins++ == 0 && s.in_lru) {  // out of the LRU: not evictable while pinned
    lru_.erase(s.lru);
    s.in_lru = false;
  }
}

void HostPool::unpin(int slot) {
  Slot& s = slots_[size_t(slot)];
  BELUGA_ASSERT(s.pins > 0);
  if (--s.pins == 0 && s.valid) to_lru_back(slot);
}

int HostPool::reserve(const BlockHash& key, bool* evicted) {
  if (evicted) *evicted = false;
  int slot = -1;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    // The least recently used entry nobody is copying: pinned ones are not in the list.
    if (lru_.empty()) return -1;
    slot = lru_.front();
    lru_.pop_front();
    Slot& old = slots_[size_t(slot)];
    old.in_lru = false;
    index_.erase(old.key);
    old.valid = false;
    if (evicted) *evicted = true;
  }
  Slot& s = slots_[size_t(slot)];
  s.key = key;
  s.pins = 1;
  s.valid = false;
  return slot;
}

void HostPool::publish(int slot) {
  Slot& s = slots_[size_t(slot)];
  BELUGA_ASSERT(!s.valid && s.pins > 0);
  auto [it, inserted] = index_.emplace(s.key, slot);
  if (!inserted) {  // stored meanwhile by another path: keep that one
    s.pins = 0;
    free_.push_back(slot);
    return;
  }
  s.valid = true;
  unpin(slot);
}

void HostPool::drop(int slot) {
  Slot& s = slots_[size_t(slot)];
  BELUGA_ASSERT(!s.valid);
  s.pins = 0;
  free_.push_back(slot);
}

}  // namespace beluga::kv
