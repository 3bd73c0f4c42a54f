// Counters of one KV tier (reported on /metrics with tier="host|disk").
#pragma once

#include <cstdint>

namespace beluga::kv {

struct TierStats {
  int64_t hits = 0;             // blocks loaded from the tier
  int64_t misses = 0;           // lookups whose next block was not in the tier
  int64_t bytes_read = 0;       // loaded from the tier
  int64_t bytes_written = 0;    // saved into the tier
  int64_t evictions = 0;        // blocks evicted for capacity
  int64_t expirations = 0;      // blocks removed because their retention had passed
  int64_t errors = 0;           // failed reads or writes (each one a miss or a dropped save)
  int64_t write_errors = 0;     // of which writes (a full disk: no_space too)
  int64_t no_space = 0;         // writes the file system refused for lack of space (ENOSPC, EDQUOT)
  int64_t partial_removed = 0;  // temporary files of dead writers removed (a crash mid-write)
  int64_t blocks = 0;           // held now
  int64_t bytes = 0;            // held now
  int64_t capacity_bytes = 0;
  double load_seconds = 0;  // total time of the loads from the tier (with hits: mean latency)
};

}  // namespace beluga::kv
