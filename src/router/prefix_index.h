// The router's approximate view of which replica holds which prompt prefix: a block's chain hash (the
// engine's prefix-cache key, engine/block_manager.h, so one key names a whole prefix of one tenant)
// -> the replicas that requests containing that block were routed to. Approximate: a replica may
// have evicted a block since. Bounded: past `capacity` blocks the least recently routed are dropped.
// Replica ids are 0..63. Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"

namespace beluga::router {

inline constexpr int kMaxReplicas = 64;

class PrefixIndex {
 public:
  explicit PrefixIndex(size_t capacity_blocks);

  // matched[r] = how many leading blocks of `hashes` were routed to replica r (matched is resized to
  // `num_replicas` and overwritten), counting only blocks last routed at or after `since_ms` (on the
  // caller's clock, as given to record()).
  void match(const std::vector<BlockHash>& hashes, int num_replicas, std::vector<int>& matched,
             int64_t since_ms = INT64_MIN) const;
  // Every block of `hashes` is now (also) on `replica`, routed at `now_ms`; they become the most
  // recently used.
  void record(const std::vector<BlockHash>& hashes, int replica, int64_t now_ms = 0);
  // The replica lost its cache (it was ejected, so probably restarted): no block points to it.
  void forget(int replica);
  size_t size() const;

 private:
  struct Entry {
    uint64_t replicas = 0;  // bit r: routed to replica r
    int64_t last_ms = 0;    // when a request holding it was last routed (to any replica)
    std::list<BlockHash>::iterator lru;
  };
  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<BlockHash> lru_;  // most recent first
  std::unordered_map<BlockHash, Entry, BlockHashHasher> map_;
};

}  // namespace beluga::router
