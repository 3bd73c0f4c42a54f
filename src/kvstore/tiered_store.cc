#include "kvstore/tiered_store.h"

#include "kvstore/fingerprint.h"
#include "model/batch.h"
#include "util/error.h"

namespace beluga::kv {

namespace {

size_t host_capacity(const StoreConfig& c) {
  if (c.host_bytes > 0 || c.disk_dir.empty()) return c.host_bytes;
  return size_t(TieredStore::kStagingBlocks) * c.block_bytes;
}

}  // namespace

TieredStore::TieredStore(StoreConfig cfg)
    : cfg_(std::move(cfg)), host_(host_capacity(cfg_), cfg_.block_bytes, cfg_.host_alloc, cfg_.retention) {
  host_stats_.capacity_bytes = int64_t(size_t(host_.capacity()) * cfg_.block_bytes);
  if (cfg_.events) host_.set_on_remove([this](const BlockHash& k) { host_removed(k); });
  if (!cfg_.disk_dir.empty()) {
    DiskConfig dc;
    dc.dir = cfg_.disk_dir;
    dc.capacity_bytes = cfg_.disk_bytes;
    dc.fingerprint = cfg_.fingerprint;
    dc.block_bytes = cfg_.block_bytes;
    dc.threads = cfg_.disk_threads;
    dc.io = cfg_.disk_io;
    dc.retention = cfg_.retention;
    dc.now = cfg_.now;
    dc.events = cfg_.events;
    disk_ = std::make_unique<DiskTier>(std::move(dc));
  }
}

TieredStore::~TieredStore() {
  disk_.reset();  // finishes the I/O in flight first: its callbacks take mu_
  std::lock_guard<std::mutex> lk(mu_);
  end_step(in_flight_, false);
  end_step(building_, false);
}

void TieredStore::drain() {
  if (disk_) disk_->drain();
}

void TieredStore::note_key(const BlockHash& tier, const BlockHash& engine) {
  if (cfg_.events) engine_keys_[tier] = engine;
}

void TieredStore::host_published(const BlockHash& tier) {
  if (!cfg_.events) return;
  if (auto it = engine_keys_.find(tier); it != engine_keys_.end())
    cfg_.events->stored(KvEventTier::kHost, it->second);
}

void TieredStore::forget_key(const BlockHash& tier) {
  if (cfg_.events && host_.find(tier, now()) < 0) engine_keys_.erase(tier);
}

void TieredStore::host_removed(const BlockHash& tier) {
  auto it = engine_keys_.find(tier);
  if (it == engine_keys_.end()) return;
  cfg_.events->removed(KvEventTier::kHost, it->second);
  engine_keys_.erase(it);
}

void TieredStore::count_reclaim(HostPool::Reclaimed why) {
  if (why == HostPool::Reclaimed::kEvicted) host_stats_.evictions++;
  host_stats_.expirations = host_.expirations();
}

int TieredStore::lookup(const BlockHash* keys, int n, KvTier* tiers) {
  int i = 0;
  const int64_t t = now();
  for (; i < n; ++i) {
    const BlockHash k = tier_key(keys[i], cfg_.fingerprint);
    bool host = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      host = host_.find(k, t) >= 0;
      if (!host) host_stats_.misses++;
      host_stats_.expirations = host_.expirations();
    }
    KvTier t = KvTier::kHost;
    if (!host) {
      if (!disk_ || !disk_->contains(k)) break;  // (the disk tier counts its misses on reads)
      t = KvTier::kDisk;
    }
    if (tiers) tiers[i] = t;
  }
  return i;
}

const std::string* TieredStore::intern(const std::string& cls) {
  return &*classes_.insert(cls).first;
}

void TieredStore::touch(const BlockHash* keys, int n, const std::string& cls) {
  const int64_t t = now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    hit_tokens_[cls].device += int64_t(n) * kKvBlockSize;
    for (int i = 0; i < n; ++i) {  // their host copies are in use too
      const int slot = host_.find(tier_key(keys[i], cfg_.fingerprint), t);
      if (slot >= 0) host_.use(slot, cls, t);
    }
    host_stats_.expirations = host_.expirations();
  }
  if (!disk_) return;
  for (int i = 0; i < n; ++i) disk_->touch(tier_key(keys[i], cfg_.fingerprint), cls);
}

KvConnector::LoadId TieredStore::start_load(const BlockHash* keys, const int* blocks, int n,
                                            const std::string& cls) {
  const LoadId id = next_load_++;
  struct Read {
    size_t part;
    BlockHash key;
    std::byte* dst;
    std::optional<BlockHash> engine;  // for the disk tier's events
  };
  std::vector<Read> reads;
  const int64_t t = now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    Load& ld = loads_[id];
    ld.blocks.assign(blocks, blocks + n);
    ld.cls = intern(cls);
    for (int i = 0; i < n; ++i) {
      const BlockHash k = tier_key(keys[i], cfg_.fingerprint);
      ld.keys.push_back(k);
      Part p;
      p.slot = host_.find(k, t);
      if (p.slot >= 0) {
        host_.use(p.slot, cls, t);
        host_.pin(p.slot);
        p.state = 1;
        if (disk_) disk_->touch(k, cls);  // its file copy is in use too
      } else {
        if (!disk_) break;
        HostPool::Reclaimed why{};
        p.slot = host_.reserve(k, cls, t, &why);  // the disk read lands here
        count_reclaim(why);
        if (p.slot < 0) break;  // every host slot is busy: the rest is computed
        note_key(k, keys[i]);
        p.from_disk = true;
        reads.push_back(
            {ld.parts.size(), k, host_.data(p.slot), cfg_.events ? std::optional(keys[i]) : std::nullopt});
        ld.pending++;
      }
      ld.parts.push_back(p);
    }
  }
  // Outside the lock: a read may complete (and take mu_) at once.
  for (const Read& r : reads)
    disk_->read(
        r.key, r.dst, cls, [this, id, part = r.part](bool ok) { on_read(id, part, ok); }, r.engine);
  return id;
}

void TieredStore::on_read(LoadId id, size_t part, bool ok) {
  std::lock_guard<std::mutex> lk(mu_);
  Load& ld = loads_.at(id);
  ld.parts[part].state = ok ? 1 : -1;
  if (--ld.pending == 0 && ld.cancelled) {
    release_parts(ld, 0);
    loads_.erase(id);
  }
}

bool TieredStore::load_ready(LoadId id) {
  std::lock_guard<std::mutex> lk(mu_);
  return loads_.at(id).pending == 0;
}

void TieredStore::release_parts(Load& ld, size_t from) {
  for (size_t i = from; i < ld.parts.size(); ++i) {
    const Part& p = ld.parts[i];
    if (!p.from_disk)
      host_.unpin(p.slot);
    else if (p.state == 1) {
      host_.publish(p.slot);  // read and verified: keep it as a host entry
      host_published(ld.keys[i]);
    } else {
      host_.drop(p.slot);
      forget_key(ld.keys[i]);
    }
  }
  ld.parts.resize(std::min(ld.parts.size(), from));
}

int TieredStore::finish_load(LoadId id, std::vector<KvCopy>& copies, KvTier* tiers) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = loads_.find(id);
  BELUGA_ASSERT(it != loads_.end() && it->second.pending == 0);
  Load& ld = it->second;
  size_t got = 0;
  while (got < ld.parts.size() && ld.parts[got].state == 1) ++got;
  release_parts(ld, got);  // after a missing or bad block nothing more is used
  for (size_t i = 0; i < got; ++i) {
    Part& p = ld.parts[i];
    int slot = p.slot;
    if (p.from_disk) {
      slot = host_.publish(slot);  // now a host entry; pinned again below for the copy
      host_published(ld.keys[i]);
      host_.pin(slot);
      hit_tokens_[*ld.cls].disk += kKvBlockSize;
    } else {
      host_stats_.hits++;
      host_stats_.bytes_read += int64_t(cfg_.block_bytes);
      hit_tokens_[*ld.cls].host += kKvBlockSize;
    }
    if (tiers) tiers[i] = p.from_disk ? KvTier::kDisk : KvTier::kHost;
    copies.push_back({ld.blocks[i], host_.data(slot)});
    building_.pins.push_back(slot);  // unpinned once the step that copies it is done
  }
  loads_.erase(it);
  return int(got);
}

void TieredStore::cancel_load(LoadId id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = loads_.find(id);
  if (it == loads_.end()) return;
  if (it->second.pending > 0) {
    it->second.cancelled = true;  // the last read cleans up
    return;
  }
  release_parts(it->second, 0);
  loads_.erase(it);
}

std::byte* TieredStore::start_save(const BlockHash& key, const std::string& cls) {
  const BlockHash k = tier_key(key, cfg_.fingerprint);
  const int64_t t = now();
  std::lock_guard<std::mutex> lk(mu_);
  if (const int found = host_.find(k, t); found >= 0) {  // below already (loaded from there, or saved before)
    host_.use(found, cls, t);
    if (disk_) disk_->touch(k, cls);
    return nullptr;
  }
  HostPool::Reclaimed why{};
  const int slot = host_.reserve(k, cls, t, &why);
  count_reclaim(why);
  if (slot < 0) return nullptr;  // every slot is being copied: this block is not saved
  note_key(k, key);
  building_.saves.push_back({slot, k, intern(cls)});
  return host_.data(slot);
}

void TieredStore::step_launched() {
  std::lock_guard<std::mutex> lk(mu_);
  BELUGA_ASSERT(in_flight_.pins.empty() && in_flight_.saves.empty());
  std::swap(in_flight_, building_);
}

void TieredStore::step_done(bool ok) {
  std::vector<StepState::Save> to_disk;
  std::vector<std::optional<BlockHash>> engine_key;  // of each to_disk block, for its disk event
  const int64_t t = now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (ok && disk_) to_disk = in_flight_.saves;
    end_step(in_flight_, ok);
    // The disk copy is written from the host entry, pinned until it is on disk.
    for (auto& sv : to_disk) {
      sv.slot = host_.find(sv.key, t);
      if (sv.slot >= 0) host_.pin(sv.slot);
      auto it = engine_keys_.find(sv.key);
      engine_key.push_back(it == engine_keys_.end() ? std::nullopt : std::optional(it->second));
    }
    host_.expire(t);  // retention holds without capacity pressure too (a few list fronts per step)
    host_stats_.expirations = host_.expirations();
    host_stats_.blocks = host_.size();
    host_stats_.bytes = int64_t(size_t(host_.size()) * cfg_.block_bytes);
  }
  for (size_t i = 0; i < to_disk.size(); ++i) {
    const auto& sv = to_disk[i];
    if (sv.slot < 0) continue;
    disk_->write(
        sv.key, host_.data(sv.slot), *sv.cls,
        [this, slot = sv.slot] {
          std::lock_guard<std::mutex> lk(mu_);
          host_.unpin(slot);
        },
        engine_key[i]);  // the disk tier reports the block once it is there, and when it goes
  }
}

void TieredStore::end_step(StepState& st, bool ok) {
  for (int slot : st.pins) host_.unpin(slot);
  for (const auto& sv : st.saves) {
    const int slot = sv.slot;
    if (ok) {
      host_.publish(slot);
      host_published(sv.key);
      host_stats_.bytes_written += int64_t(cfg_.block_bytes);
    } else {
      host_.drop(slot);
      forget_key(sv.key);
    }
  }
  st.pins.clear();
  st.saves.clear();
  host_stats_.blocks = host_.size();
  host_stats_.bytes = int64_t(size_t(host_.size()) * cfg_.block_bytes);
}

TieredStore::Pinned::~Pinned() {
  if (!store_) return;
  std::lock_guard<std::mutex> lk(store_->mu_);
  for (int slot : slots_) store_->host_.unpin(slot);
}

TieredStore::Pinned TieredStore::pin_host_blocks(const BlockHash* keys, int n) {
  Pinned p;
  p.store_ = this;
  const int64_t t = now();
  std::lock_guard<std::mutex> lk(mu_);
  for (int i = 0; i < n; ++i) {
    const int slot = host_.find(tier_key(keys[i], cfg_.fingerprint), t);
    if (slot < 0) break;
    host_.pin(slot);
    p.slots_.push_back(slot);
    p.data_.push_back(host_.data(slot));
  }
  host_stats_.expirations = host_.expirations();
  return p;
}

TieredStore::ImportSlot TieredStore::begin_import(const BlockHash& key, const std::string& cls) {
  const BlockHash k = tier_key(key, cfg_.fingerprint);
  const int64_t t = now();
  ImportSlot r;
  std::lock_guard<std::mutex> lk(mu_);
  if (const int found = host_.find(k, t); found >= 0) {
    host_.use(found, cls, t);
    r.held = true;
    return r;
  }
  HostPool::Reclaimed why{};
  r.slot = host_.reserve(k, cls, t, &why);
  count_reclaim(why);
  if (r.slot >= 0) r.dst = host_.data(r.slot);
  return r;
}

void TieredStore::end_import(int slot, bool ok) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ok) {
    host_.publish(slot);
    host_stats_.bytes_written += int64_t(cfg_.block_bytes);
  } else {
    host_.drop(slot);
  }
  host_stats_.blocks = host_.size();
  host_stats_.bytes = int64_t(size_t(host_.size()) * cfg_.block_bytes);
}

StoreStats TieredStore::stats() const {
  StoreStats s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    s.host = host_stats_;
    s.hit_tokens = hit_tokens_;
    s.host_class_blocks = host_.blocks_by_class();
  }
  if (disk_) s.disk = disk_->stats();
  return s;
}

}  // namespace beluga::kv
