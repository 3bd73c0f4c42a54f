// Counters of one KV tier (reported on /metrics with tier="host|disk").
#pragma once

#include <cstdint>

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
  int64_t bytes = 0;          // held now
  int64_t capacity_bytes = 0;
  double load_seconds = 0;  // total time of the loads from the tier (with hits: mean latency)
};

}  // namespace beluga::kv
