// KV block events: which prefix-cache blocks (by chain hash, block_manager.h) a replica holds, and in
// which tier, as a numbered log a router reads to keep an exact cache index (Dynamo's KV events).
//
// KvEventSink is what the block owners call (BlockManager for the device pool, kv::TieredStore for
// host memory and files): stored/removed of one block in one tier. KvEventLog is the sink `beluga
// serve` uses: a bounded ring of the newest events, numbered from 1, plus the current set of held
// (block, tier) pairs, so that a reader who fell behind the ring, or who saw another epoch (the
// replica restarted: a fresh random epoch per log), gets a snapshot of that set instead of events.
// Writers (the engine thread, the disk tier's I/O threads) hold its mutex for O(1) work; a reader
// copies at most `max_events` under it (a snapshot copies the whole set). Thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"

namespace beluga {

enum class KvEventTier : uint8_t { kDevice = 0, kHost = 1, kDisk = 2 };
inline constexpr int kNumKvEventTiers = 3;
const char* kv_event_tier_name(KvEventTier t);  // device, host, disk

class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void stored(KvEventTier tier, const BlockHash& block) = 0;
  virtual void removed(KvEventTier tier, const BlockHash& block) = 0;
};

struct KvEvent {
  uint64_t seq = 0;  // a snapshot's entries all carry the snapshot's seq
  BlockHash block;
  KvEventTier tier = KvEventTier::kDevice;
  bool stored = true;  // false: removed
};

struct KvEventPage {
  uint64_t epoch = 0;
  uint64_t seq = 0;       // the newest event this page accounts for: ask for after=seq next
  bool snapshot = false;  // events are the full current state (all stored); drop what you had
  bool more = false;      // newer events are waiting (the page was cut at max_events)
  std::vector<KvEvent> events;
};

class KvEventLog final : public KvEventSink {
 public:
  // `epoch`: 0 draws a random non-zero one.
  explicit KvEventLog(size_t ring_capacity, uint64_t epoch = 0);

  uint64_t epoch() const { return epoch_; }
  uint64_t seq() const;        // the newest event's number (0: none yet)
  size_t held_blocks() const;  // (block, tier) pairs held now

  void stored(KvEventTier tier, const BlockHash& block) override;
  void removed(KvEventTier tier, const BlockHash& block) override;

  // The events after `after` of epoch `epoch` (at most max_events), or a snapshot when `epoch` is
  // not this log's, `after` is ahead of the log, or events after it have left the ring.
  KvEventPage read(uint64_t epoch, uint64_t after, size_t max_events) const;

 private:
  void append(KvEventTier tier, const BlockHash& block, bool stored);  // mu_ held

  const uint64_t epoch_;
  mutable std::mutex mu_;
  std::vector<KvEvent> ring_;  // event seq s at ring_[(s - 1) % capacity]
  uint64_t seq_ = 0;
  std::unordered_map<BlockHash, uint8_t, BlockHashHasher> held_;  // bit t: held in tier t
};

}  // namespace beluga
