#include "router/prefix_index.h"

#include <algorithm>
#include <bit>

namespace beluga::router {

PrefixIndex::PrefixIndex(size_t capacity_blocks) : capacity_(std::max<size_t>(1, capacity_blocks)) {}

void PrefixIndex::match(const std::vector<BlockHash>& hashes, int num_replicas, std::vector<int>& matched,
                        int64_t since_ms) const {
  matched.assign(size_t(num_replicas), 0);
  uint64_t alive = num_replicas >= 64 ? ~uint64_t(0) : (uint64_t(1) << num_replicas) - 1;
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < hashes.size() && alive; ++i) {
    auto it = map_.find(hashes[i]);
    if (it == map_.end() || it->second.last_ms < since_ms) break;
    alive &= it->second.replicas;
    for (uint64_t m = alive; m; m &= m - 1) matched[size_t(std::countr_zero(m))] = int(i + 1);
  }
}

void PrefixIndex::record(const std::vector<BlockHash>& hashes, int replica, int64_t now_ms) {
  if (replica < 0 || replica >= kMaxReplicas) return;
  const uint64_t bit = uint64_t(1) << replica;
  std::lock_guard lock(mu_);
  for (const BlockHash& h : hashes) {
    auto it = map_.find(h);
    if (it != map_.end()) {
      it->second.replicas |= bit;
      it->second.last_ms = std::max(it->second.last_ms, now_ms);
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      continue;
    }
    lru_.push_front(h);
    map_.emplace(h, Entry{bit, now_ms, lru_.begin()});
    while (map_.size() > capacity_) {
      map_.erase(lru_.back());
      lru_.pop_back();
    }
  }
}

void PrefixIndex::forget(int replica) {
  if (replica < 0 || replica >= kMaxReplicas) return;
  const uint64_t bit = uint64_t(1) << replica;
  std::lock_guard lock(mu_);
  for (auto it = map_.begin(); it != map_.end();) {
    it->second.replicas &= ~bit;
    if (it->second.replicas == 0) {
      lru_.erase(it->second.lru);
      it = map_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t PrefixIndex::size() const {
  std::lock_guard lock(mu_);
  return map_.size();
}

}  // namespace beluga::router
