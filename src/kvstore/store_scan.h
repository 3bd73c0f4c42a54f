// A walk over every block file of a KV directory (all models' fingerprints), for `beluga kv stats`
// and `beluga kv gc`. Temporary files of writers still at work and files that do not parse are
// skipped (counted in `invalid`); the server removes bad files when it reads them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kvstore/block_file.h"

namespace beluga::kv {

struct ScannedBlock {
  std::string path;
  BlockFileHeader header;
  int64_t last_used = 0;  // the later of the header's and the file's mtime
  uint64_t bytes = 0;     // of the file
};

// Throws when `dir` is not a directory.
void scan_store(const std::string& dir, const std::function<void(const ScannedBlock&)>& visit,
                int64_t* invalid = nullptr);

// The temporary files under `dir` (writes in progress, or left by a writer killed mid-write):
// `abandoned` of them belong to writers that are gone (block_temp_abandoned); with `remove`, those
// are deleted. Throws when `dir` is not a directory.
struct TempFiles {
  int64_t total = 0, abandoned = 0, removed = 0;
};
TempFiles scan_temp_files(const std::string& dir, bool remove);

}  // namespace beluga::kv
