#include "kvstore/store_scan.h"

#include <unistd.h>

#include <filesystem>

#include "util/error.h"

namespace beluga::kv {

namespace fs = std::filesystem;

void scan_store(const std::string& dir, const std::function<void(const ScannedBlock&)>& visit,
                int64_t* invalid) {
  std::error_code ec;
  BELUGA_CHECK(fs::is_directory(dir, ec), "no KV directory at ", dir);
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it.depth() > 2 || !it->is_regular_file(ec)) continue;  // DIR/<fingerprint>/<shard>/<key>.kvb
    const std::string path = it->path().string();
    if (it->path().extension() != ".kvb") continue;  // temporary files and strangers
    ScannedBlock b;
    b.path = path;
    int64_t mtime = 0;
    if (read_block_header(path, &b.header, &mtime) != BlockFileStatus::kOk) {
      if (invalid) ++*invalid;
      continue;
    }
    b.last_used = std::max(b.header.last_used, mtime);
    b.bytes = uint64_t(it->file_size(ec));
    visit(b);
  }
}

TempFiles scan_temp_files(const std::string& dir, bool remove) {
  std::error_code ec;
  BELUGA_CHECK(fs::is_directory(dir, ec), "no KV directory at ", dir);
  TempFiles t;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it.depth() > 2 || !it->is_regular_file(ec) || !is_block_temp_name(it->path().filename().string()))
      continue;
    const std::string path = it->path().string();
    t.total++;
    if (!block_temp_abandoned(path)) continue;
    t.abandoned++;
    if (remove && ::unlink(path.c_str()) == 0) t.removed++;
  }
  return t;
}

}  // namespace beluga::kv
