// TieredStore: the KV connector (engine/kv_connector.h) over the tiers below the device pool. Blocks
// are keyed by tier_key(chained block hash, model fingerprint).
//
// Host tier: a HostPool. Saving is write-through: every block a step fills is copied down right after
// the step computed it (SGLang HiCache's write_through, vLLM's offloading connector), not when the
// device pool evicts it (write_back). Eviction from the device pool then costs nothing and needs no
// copy ordered before the block's reuse, the copy leaves the critical path of the step that needs the
// block, and a block is below the device before a crash or restart (what the file tier needs for
// retention in days and for replicas sharing a directory). The price is a copy of every computed
// block (deduplicated by key: a block already below is not copied again).
//
// Thread-safe: the KvConnector calls come from the engine thread, stats() from anywhere.
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "engine/kv_connector.h"
#include "kvstore/host_pool.h"

namespace beluga::kv {

struct TierStats {
  int64_t hits = 0;           // blocks loaded from the tier
  int64_t misses = 0;         // lookups whose next block was not in the tier
  int64_t bytes_read = 0;     // loaded from the tier
  int64_t bytes_written = 0;  // saved into the tier
  int64_t evictions = 0;      // blocks evicted for capacity
  int64_t expirations = 0;    // blocks removed because their retention had passed
  int64_t errors = 0;         // failed reads or writes (each one a miss or a dropped save)
  int64_t blocks = 0;         // held now
  int64_t capacity_blocks = 0;
};

struct StoreStats {
  TierStats host;
};

struct StoreConfig {
  size_t block_bytes = 0;  // the model's KV bytes per block
  BlockHash fingerprint;   // kvstore/fingerprint.h
  size_t host_bytes = 0;   // the host tier's capacity
  HostAllocator host_alloc = HostAllocator::plain();
};

class TieredStore final : public KvConnector {
 public:
  explicit TieredStore(StoreConfig cfg);
  ~TieredStore() override;

  size_t block_bytes() const override { return cfg_.block_bytes; }
  int lookup(const BlockHash* keys, int n, KvTier* tiers) override;
  LoadId start_load(const BlockHash* keys, const int* blocks, int n) override;
  bool load_ready(LoadId id) override;
  int finish_load(LoadId id, std::vector<KvCopy>& copies) override;
  void cancel_load(LoadId id) override;
  std::byte* start_save(const BlockHash& key) override;
  void step_launched() override;
  void step_done(bool ok) override;

  StoreStats stats() const;

 private:
  struct Load {
    std::vector<int> blocks;  // device blocks
    std::vector<int> slots;   // the host slots found (pinned), leading
  };
  struct StepState {
    std::vector<int> pins;   // host slots read by the step's loads
    std::vector<int> saves;  // host slots reserved for its saves
  };
  void end_step(StepState& st, bool ok);

  StoreConfig cfg_;
  mutable std::mutex mu_;
  HostPool host_;
  std::unordered_map<LoadId, Load> loads_;
  LoadId next_load_ = 0;
  StepState building_, in_flight_;
  StoreStats stats_;
};

}  // namespace beluga::kv
