#include "kvstore/tiered_store.h"

#include "kvstore/fingerprint.h"
#include "util/error.h"

namespace beluga::kv {

TieredStore::TieredStore(StoreConfig cfg)
    : cfg_(std::move(cfg)), host_(cfg_.host_bytes, cfg_.block_bytes, cfg_.host_alloc) {
  stats_.host.capacity_blocks = host_.capacity();
}

TieredStore::~TieredStore() {
  // The engine is gone (it must not outlive its connector): nothing is in flight any more.
  std::lock_guard<std::mutex> lk(mu_);
  end_step(in_flight_, false);
  end_step(building_, false);
}

int TieredStore::lookup(const BlockHash* keys, int n, KvTier* tiers) {
  std::lock_guard<std::mutex> lk(mu_);
  int i = 0;
  for (; i < n; ++i) {
    if (host_.find(tier_key(keys[i], cfg_.fingerprint), false) < 0) break;
    if (tiers) tiers[i] = KvTier::kHost;
  }
  if (i < n) stats_.host.misses++;
  return i;
}

KvConnector::LoadId TieredStore::start_load(const BlockHash* keys, const int* blocks, int n) {
  std::lock_guard<std::mutex> lk(mu_);
  Load ld;
  ld.blocks.assign(blocks, blocks + n);
  for (int i = 0; i < n; ++i) {
    const int slot = host_.find(tier_key(keys[i], cfg_.fingerprint), true);
    if (slot < 0) break;  // evicted since the lookup: the rest is computed
    host_.pin(slot);
    ld.slots.push_back(slot);
  }
  const LoadId id = next_load_++;
  loads_.emplace(id, std::move(ld));
  return id;
}

bool TieredStore::load_ready(LoadId id) {
  std::lock_guard<std::mutex> lk(mu_);
  return loads_.count(id) > 0;  // host loads are ready at once
}

int TieredStore::finish_load(LoadId id, std::vector<KvCopy>& copies) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = loads_.find(id);
  BELUGA_ASSERT(it != loads_.end());
  Load& ld = it->second;
  const int got = int(ld.slots.size());
  for (int i = 0; i < got; ++i) {
    copies.push_back({ld.blocks[size_t(i)], host_.data(ld.slots[size_t(i)])});
    building_.pins.push_back(ld.slots[size_t(i)]);  // unpinned once the step that copies it is done
  }
  stats_.host.hits += got;
  stats_.host.bytes_read += int64_t(got) * int64_t(cfg_.block_bytes);
  loads_.erase(it);
  return got;
}

void TieredStore::cancel_load(LoadId id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = loads_.find(id);
  if (it == loads_.end()) return;
  for (int slot : it->second.slots) host_.unpin(slot);
  loads_.erase(it);
}

std::byte* TieredStore::start_save(const BlockHash& key) {
  std::lock_guard<std::mutex> lk(mu_);
  const BlockHash k = tier_key(key, cfg_.fingerprint);
  if (host_.find(k, true) >= 0) return nullptr;  // below already (loaded from there, or saved before)
  bool evicted = false;
  const int slot = host_.reserve(k, &evicted);
  if (evicted) stats_.host.evictions++;
  if (slot < 0) return nullptr;  // every slot is being copied: this block is not saved
  building_.saves.push_back(slot);
  return host_.data(slot);
}

void TieredStore::step_launched() {
  std::lock_guard<std::mutex> lk(mu_);
  BELUGA_ASSERT(in_flight_.pins.empty() && in_flight_.saves.empty());
  std::swap(in_flight_, building_);
}

void TieredStore::step_done(bool ok) {
  std::lock_guard<std::mutex> lk(mu_);
  end_step(in_flight_, ok);
}

void TieredStore::end_step(StepState& st, bool ok) {
  for (int slot : st.pins) host_.unpin(slot);
  for (int slot : st.saves) {
    if (ok) {
      host_.publish(slot);
      stats_.host.bytes_written += int64_t(cfg_.block_bytes);
    } else {
      host_.drop(slot);
    }
  }
  st.pins.clear();
  st.saves.clear();
  stats_.host.blocks = host_.size();
}

StoreStats TieredStore::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

}  // namespace beluga::kv
