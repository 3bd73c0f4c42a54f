#include "kvstore/host_pool.h"

#include <cstdlib>

#include "util/error.h"

namespace beluga::kv {

HostAllocator HostAllocator::plain() {
  return {[](size_t n) { return std::aligned_alloc(64, (n + 63) / 64 * 64); }, [](void* p) { std::free(p); }};
}

HostPool::HostPool(size_t capacity_bytes, size_t block_bytes, HostAllocator alloc, Retention retention)
    : block_bytes_(block_bytes), alloc_(std::move(alloc)), retention_(std::move(retention)) {
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
  for (const std::string& c : retention_.classes()) class_id(c);  // the known classes, in a fixed order
}

HostPool::~HostPool() {
  alloc_.free(base_);
}

int HostPool::class_id(const std::string& cls) {
  for (size_t i = 0; i < classes_.size(); ++i)
    if (classes_[i] == cls) return int(i);
  classes_.push_back(cls);
  class_ret_.push_back(retention_.of(cls));
  lru_.emplace_back();
  return int(classes_.size() - 1);
}

void HostPool::unlink_lru(int slot) {
  Slot& s = slots_[size_t(slot)];
  if (!s.in_lru) return;
  lru_[size_t(s.cls)].erase(s.lru);
  s.in_lru = false;
}

void HostPool::to_lru_back(int slot) {
  unlink_lru(slot);
  Slot& s = slots_[size_t(slot)];
  auto& l = lru_[size_t(s.cls)];
  s.lru = l.insert(l.end(), slot);
  s.in_lru = true;
}

void HostPool::remove_entry(int slot) {
  Slot& s = slots_[size_t(slot)];
  BELUGA_ASSERT(s.valid && s.pins == 0);
  unlink_lru(slot);
  index_.erase(s.key);
  s.valid = false;
  free_.push_back(slot);
  if (on_remove_) on_remove_(s.key);
}

int HostPool::find(const BlockHash& key, int64_t now) {
  auto it = index_.find(key);
  if (it == index_.end()) return -1;
  const int slot = it->second;
  Slot& s = slots_[size_t(slot)];
  if (s.pins == 0 && expired(s, now)) {  // a pinned entry is in use: not expired
    remove_entry(slot);
    expirations_++;
    return -1;
  }
  return slot;
}

void HostPool::use(int slot, const std::string& cls, int64_t now) {
  Slot& s = slots_[size_t(slot)];
  s.last_used = std::max(s.last_used, now);
  const int c = class_id(cls);
  if (class_ret_[size_t(c)] > class_ret_[size_t(s.cls)]) {
    unlink_lru(slot);
    s.cls = c;
  }
  if (s.pins == 0 && s.valid) to_lru_back(slot);
}

void HostPool::pin(int slot) {
  Slot& s = slots_[size_t(slot)];
  if (s.pins++ == 0) unlink_lru(slot);  // out of the LRU: not evictable while pinned
}

void HostPool::unpin(int slot) {
  Slot& s = slots_[size_t(slot)];
  BELUGA_ASSERT(s.pins > 0);
  if (--s.pins == 0 && s.valid) to_lru_back(slot);
}

int HostPool::reserve(const BlockHash& key, const std::string& cls, int64_t now, Reclaimed* why) {
  if (why) *why = Reclaimed::kNone;
  const int c = class_id(cls);
  int slot = -1;
  if (free_.empty()) {
    // Each class's list is in order of use: its front is its oldest entry. An expired front goes
    // first; else the least recently used front of all.
    int victim = -1;
    bool victim_expired = false;
    for (const auto& l : lru_) {
      if (l.empty()) continue;
      const Slot& s = slots_[size_t(l.front())];
      if (expired(s, now)) {
        victim = l.front();
        victim_expired = true;
        break;
      }
      if (victim < 0 || s.last_used < slots_[size_t(victim)].last_used) victim = l.front();
    }
    if (victim < 0) return -1;  // every slot is pinned
    remove_entry(victim);
    if (victim_expired) expirations_++;
    if (why) *why = victim_expired ? Reclaimed::kExpired : Reclaimed::kEvicted;
  }
  slot = free_.back();
  free_.pop_back();
  Slot& s = slots_[size_t(slot)];
  s.key = key;
  s.pins = 1;
  s.valid = false;
  s.in_lru = false;
  s.cls = c;
  s.last_used = now;
  return slot;
}

int HostPool::publish(int slot) {
  Slot& s = slots_[size_t(slot)];
  BELUGA_ASSERT(!s.valid && s.pins > 0);
  auto [it, inserted] = index_.emplace(s.key, slot);
  if (!inserted) {  // stored meanwhile by another path: keep that one
    s.pins = 0;
    free_.push_back(slot);
    return it->second;
  }
  s.valid = true;
  unpin(slot);
  return slot;
}

void HostPool::drop(int slot) {
  Slot& s = slots_[size_t(slot)];
  BELUGA_ASSERT(!s.valid);
  s.pins = 0;
  free_.push_back(slot);
}

int64_t HostPool::expire(int64_t now) {
  int64_t n = 0;
  for (auto& l : lru_)
    while (!l.empty() && expired(slots_[size_t(l.front())], now)) {
      remove_entry(l.front());
      ++n;
    }
  expirations_ += n;
  return n;
}

std::map<std::string, int64_t> HostPool::blocks_by_class() const {
  std::map<std::string, int64_t> m;
  for (const auto& [k, slot] : index_) m[classes_[size_t(slots_[size_t(slot)].cls)]]++;
  return m;
}

}  // namespace beluga::kv
