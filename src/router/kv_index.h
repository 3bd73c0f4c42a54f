// The router's exact view of the replicas' KV caches, built from their block events
// (engine/kv_events.h, read by KvEventsClient): per replica, the blocks it holds (chain hashes, as
// the prefix index keys them) and in which tiers. A replica is `live` once a page of its events has
// been applied; until then (or when it publishes none) the router falls back to the approximate
// PrefixIndex. A snapshot (what a replica answers a read of another epoch, or one that fell behind
// its ring) replaces the replica's entries: a restarted replica's index is rebuilt. Thread-safe: pages are
// applied while requests match.
#pragma once

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "engine/kv_events.h"

namespace beluga::router {

struct TierMatch {
  int blocks = 0;  // leading blocks of the prompt the replica holds in some tier
  int host = 0;    // of those, the blocks whose fastest copy is in host memory
  int disk = 0;    // ... in files
};

class KvIndex {
 public:
  explicit KvIndex(int num_replicas);

  // Where the next read of replica r starts: its epoch (0: none yet, ask for a snapshot) and seq.
  struct Cursor {
    uint64_t epoch = 0, seq = 0;
  };
  Cursor cursor(int r) const;
  // A snapshot replaces r's entries; events apply on top of the view they were read after (others,
  // of another epoch or after a reset, are dropped and the next cursor asks for a snapshot).
  void apply(int r, const KvEventPage& page);
  // Forgets replica r's entries (it was ejected: its cache is presumed lost); it is not live until
  // the next page, which is a snapshot.
  void reset(int r);
  bool live(int r) const;
  TierMatch match(int r, const std::vector<BlockHash>& hashes) const;
  size_t blocks(int r) const;         // blocks replica r holds in any tier
  uint64_t epochs_seen(int r) const;  // epoch changes applied (1 after the first page; more: restarts)

 private:
  struct View {
    mutable std::shared_mutex mu;
    bool live = false;
    uint64_t epoch = 0, seq = 0;          // the cursor (epoch 0 after a reset)
    uint64_t seen_epoch = 0, epochs = 0;  // the replica's last epoch, and how many it had
    std::unordered_map<BlockHash, uint8_t, BlockHashHasher> tiers;  // bit t: held in KvEventTier t
  };
  std::vector<std::unique_ptr<View>> views_;
};

}  // namespace beluga::router
