#include "kvstore/disk_tier.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <vector>

#include "kvstore/block_file.h"
#include "model/batch.h"
#include "util/error.h"

namespace beluga::kv {

namespace fs = std::filesystem;

DiskTier::DiskTier(DiskConfig cfg) : cfg_(std::move(cfg)), io_(open_block_io(cfg_.io, cfg_.threads)) {
  BELUGA_CHECK(!cfg_.dir.empty() && cfg_.block_bytes > 0, "the disk KV tier needs a directory");
  root_ = cfg_.dir + "/" + key_hex(cfg_.fingerprint);
  std::error_code ec;
  fs::create_directories(root_, ec);
  BELUGA_CHECK(!ec && fs::is_directory(root_), "cannot create the KV directory ", root_, ": ", ec.message());
  capacity_ = cfg_.capacity_bytes;
  if (capacity_ == 0) {
    struct statvfs sv {};
    BELUGA_CHECK(::statvfs(root_.c_str(), &sv) == 0, "cannot statvfs ", root_);
    capacity_ = size_t(sv.f_bavail) * size_t(sv.f_frsize);  // the scan's bytes are added to it below
    capacity_from_free_ = true;
  }
  stats_.capacity_bytes = int64_t(capacity_);
  scanner_ = std::thread([this] { scan(); });
}

DiskTier::~DiskTier() {
  stop_ = true;
  if (scanner_.joinable()) scanner_.join();
  io_->drain();
}

std::string DiskTier::path_of(const BlockHash& key) const {
  const std::string h = key_hex(key);
  return root_ + "/" + h.substr(0, 2) + "/" + h + ".kvb";
}

void DiskTier::add(const BlockHash& key, uint64_t bytes, int64_t last_used, const std::string& cls) {
  auto [it, inserted] = index_.try_emplace(key, Entry{bytes, last_used, last_used, cls, std::nullopt});
  if (inserted) {
    bytes_ += bytes;
  } else {
    it->second.last_used = std::max(it->second.last_used, last_used);
    if (cfg_.retention.of(cls) > cfg_.retention.of(it->second.cls)) it->second.cls = cls;
  }
  stats_.blocks = int64_t(index_.size());
  stats_.bytes = int64_t(bytes_);
}

void DiskTier::forget(const BlockHash& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  if (it->second.reported) cfg_.events->removed(KvEventTier::kDisk, *it->second.reported);
  bytes_ -= it->second.bytes;
  index_.erase(it);
  stats_.blocks = int64_t(index_.size());
  stats_.bytes = int64_t(bytes_);
}

void DiskTier::report(const BlockHash& key, const std::optional<BlockHash>& engine) {
  if (!cfg_.events || !engine) return;
  auto it = index_.find(key);
  if (it == index_.end() || it->second.reported) return;
  it->second.reported = engine;
  cfg_.events->stored(KvEventTier::kDisk, *engine);
}

void DiskTier::scan() {
  std::error_code ec;
  for (auto sub = fs::directory_iterator(root_, ec); !ec && sub != fs::directory_iterator();
       sub.increment(ec)) {
    if (!sub->is_directory(ec)) continue;
    for (auto f = fs::directory_iterator(sub->path(), ec); !ec && f != fs::directory_iterator();
         f.increment(ec)) {
      if (stop_) return;
      const std::string name = f->path().filename().string();
      const std::string path = f->path().string();
      if (is_block_temp_name(name)) {
        // Judged by the real clock, as the file's mtime is (the retention clock, injected in tests,
        // may be far from it), and by its writer's pid: a live writer's file must never go.
        if (block_temp_abandoned(path) && ::unlink(path.c_str()) == 0) {
          std::lock_guard<std::mutex> lk(mu_);
          stats_.partial_removed++;
        }
        continue;
      }
      BlockHash key;
      if (name.size() != 36 || name.substr(32) != ".kvb" || !key_from_hex(name.substr(0, 32), &key)) continue;
      BlockFileHeader h;
      int64_t mtime = 0;
      const BlockFileStatus s = read_block_header(path, &h, &mtime);
      std::lock_guard<std::mutex> lk(mu_);
      if (s != BlockFileStatus::kOk || !(h.key == key) || !(h.fingerprint == cfg_.fingerprint) ||
          h.payload_bytes != cfg_.block_bytes) {
        if (s != BlockFileStatus::kIoError && s != BlockFileStatus::kMissing) {
          ::unlink(path.c_str());  // truncated, corrupt or foreign
          stats_.errors++;
        }
        continue;
      }
      const bool known = index_.count(key) > 0;
      add(key, kBlockFileHeaderBytes + h.payload_bytes, std::max(h.last_used, mtime), h.cls);
      if (!known && capacity_from_free_) capacity_ += kBlockFileHeaderBytes + h.payload_bytes;
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stats_.capacity_bytes = int64_t(capacity_);
  }
  scan_done_ = true;
}

bool DiskTier::contains(const BlockHash& key) {
  const int64_t t = now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = index_.find(key);
    if (it != index_.end()) return !expired(it->second, t) || !expire_one(key, it->second, t);
  }
  // Not (yet) in the index: written by another server, or the scan has not reached it.
  BlockFileHeader h;
  int64_t mtime = 0;
  if (read_block_header(path_of(key), &h, &mtime) != BlockFileStatus::kOk || !(h.key == key) ||
      !(h.fingerprint == cfg_.fingerprint) || h.payload_bytes != cfg_.block_bytes)
    return false;  // a bad file is removed when a read finds it
  std::lock_guard<std::mutex> lk(mu_);
  add(key, kBlockFileHeaderBytes + h.payload_bytes, std::max(h.last_used, mtime), h.cls);
  auto it = index_.find(key);
  return !expired(it->second, t) || !expire_one(key, it->second, t);
}

bool DiskTier::expire_one(const BlockHash& key, Entry& e, int64_t t) {
  const std::string path = path_of(key);
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && int64_t(st.st_mtime) > e.last_used) {
    e.last_used = e.persisted_use = int64_t(st.st_mtime);  // used meanwhile by a server sharing the directory
    if (!expired(e, t)) return false;
  }
  ::unlink(path.c_str());
  forget(key);
  stats_.expirations++;
  return true;
}

int64_t DiskTier::expire() {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t t = now();
  last_expire_ = t;
  std::vector<BlockHash> old;
  for (const auto& [k, e] : index_)
    if (expired(e, t)) old.push_back(k);
  int64_t n = 0;
  for (const BlockHash& k : old) n += expire_one(k, index_.at(k), t);
  return n;
}

void DiskTier::touch(const BlockHash& key, const std::string& cls) {
  std::lock_guard<std::mutex> lk(mu_);
  touch_locked(key, cls);
}

void DiskTier::touch_locked(const BlockHash& key, const std::string& cls) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  Entry& e = it->second;
  const int64_t t = now();
  e.last_used = std::max(e.last_used, t);
  if (cfg_.retention.of(cls) > cfg_.retention.of(e.cls)) {
    e.cls = cls;
    io_->job([this, key, cls] { update_block_class(path_of(key), cfg_.fingerprint, key, cls, io_->sync()); });
  }
  if (t - e.persisted_use >= 60) {  // the file's mtime is its last use, kept to the minute
    e.persisted_use = t;
    io_->job([this, key, t] {
      const struct timespec ts[2] = {{0, UTIME_OMIT}, {time_t(t), 0}};
      ::utimensat(AT_FDCWD, path_of(key).c_str(), ts, 0);
    });
  }
}

std::map<std::string, DiskTier::ClassUsage> DiskTier::by_class() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::map<std::string, ClassUsage> m;
  for (const auto& [k, e] : index_) {
    m[e.cls].blocks++;
    m[e.cls].bytes += int64_t(e.bytes);
  }
  return m;
}

void DiskTier::read(const BlockHash& key, std::byte* dst, const std::string& cls,
                    std::function<void(bool)> done, std::optional<BlockHash> report_as) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string path = path_of(key);
  io_->read(path, cfg_.fingerprint, key, cfg_.block_bytes, dst,
            [this, key, cls, t0, path, report_as, done = std::move(done)](BlockFileStatus s,
                                                                          const BlockFileHeader&) {
              const bool ok = s == BlockFileStatus::kOk;
              if (!ok && s != BlockFileStatus::kIoError && s != BlockFileStatus::kMissing) {
                ::unlink(path.c_str());  // truncated, corrupt or foreign: never served, not kept
              }
              const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
              {
                std::lock_guard<std::mutex> lk(mu_);
                if (ok) {
                  stats_.hits++;
                  stats_.bytes_read += int64_t(cfg_.block_bytes);
                  stats_.load_seconds += dt;
                  touch_locked(key, cls);
                  report(key, report_as);
                } else {
                  stats_.misses++;
                  if (s != BlockFileStatus::kMissing) stats_.errors++;
                  forget(key);  // gone (deleted behind our back) or bad: reported removed
                }
              }
              done(ok);
            });
}

void DiskTier::make_room(uint64_t incoming) {
  incoming += writing_bytes_;  // the writes in flight will land too
  if (bytes_ + incoming <= capacity_) return;
  // Expired blocks go first, then the least recently used.
  const int64_t t = now();
  std::vector<BlockHash> old;
  for (const auto& [k, e] : index_)
    if (expired(e, t)) old.push_back(k);
  for (const BlockHash& k : old) expire_one(k, index_.at(k), t);
  if (bytes_ + incoming <= capacity_) return;
  // Evict down to 90% of the capacity in one go, least recently used first.
  std::vector<std::pair<int64_t, BlockHash>> by_age;
  by_age.reserve(index_.size());
  for (const auto& [k, e] : index_) by_age.push_back({e.last_used, k});
  std::sort(by_age.begin(), by_age.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  const uint64_t target = capacity_ / 10 * 9;
  for (const auto& [t, k] : by_age) {
    if (bytes_ + incoming <= target) break;
    ::unlink(path_of(k).c_str());
    forget(k);
    stats_.evictions++;
  }
}

void DiskTier::shrink_to_free_space() {
  // The file system holds less than the capacity promised (other files, a quota, a shared disk):
  // what it can take is what the tier holds plus what is free now, so the next writes evict the
  // least recently used blocks instead of failing for ever.
  struct statvfs sv {};
  if (::statvfs(root_.c_str(), &sv) != 0) return;
  const uint64_t room = bytes_ + uint64_t(sv.f_bavail) * uint64_t(sv.f_frsize);
  if (room < capacity_) {
    capacity_ = room;
    stats_.capacity_bytes = int64_t(capacity_);
  }
}

void DiskTier::write(const BlockHash& key, const std::byte* src, const std::string& cls,
                     std::function<void()> done, std::optional<BlockHash> report_as) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    // There already (saved before, or by another server): known by its engine key from now on.
    // Being written: that write names the same block.
    if (index_.count(key) || !writing_.insert(key).second) {
      report(key, report_as);
      done();
      return;
    }
  }
  // Room and the shard directory on a worker (unlinks and mkdir block), then the file on the I/O path.
  io_->job([this, key, src, cls, report_as, done = std::move(done)]() mutable {
    BlockFileHeader h;
    h.fingerprint = cfg_.fingerprint;
    h.key = key;
    h.tokens = kKvBlockSize;
    h.cls = cls;
    h.created = h.last_used = now();
    h.payload_bytes = cfg_.block_bytes;
    const uint64_t bytes = kBlockFileHeaderBytes + cfg_.block_bytes;
    bool expire_due = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      make_room(bytes);
      writing_bytes_ += bytes;
      expire_due = now() - last_expire_ >= 60;
    }
    if (expire_due) expire();  // retention holds without capacity pressure too
    std::string path = path_of(key);
    ::mkdir(path.substr(0, path.rfind('/')).c_str(), 0755);  // its shard, made on first use
    io_->write(std::move(path), h, src,
               [this, key, cls, bytes, report_as, last_used = h.last_used,
                done = std::move(done)](BlockFileStatus s) {
                 {
                   std::lock_guard<std::mutex> lk(mu_);
                   writing_.erase(key);
                   writing_bytes_ -= bytes;
                   if (s == BlockFileStatus::kOk) {
                     add(key, bytes, last_used, cls);
                     report(key, report_as);
                     stats_.bytes_written += int64_t(cfg_.block_bytes);
                   } else {
                     stats_.errors++;  // a full disk or an I/O error: the block is simply not saved
                     stats_.write_errors++;
                     if (s == BlockFileStatus::kNoSpace) {
                       stats_.no_space++;
                       shrink_to_free_space();
                     }
                   }
                 }
                 done();
               });
  });
}

TierStats DiskTier::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace beluga::kv
