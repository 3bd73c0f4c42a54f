#include "router/kv_index.h"

#include <mutex>

namespace beluga::router {

KvIndex::KvIndex(int num_replicas) {
  for (int i = 0; i < num_replicas; ++i) views_.push_back(std::make_unique<View>());
}

KvIndex::Cursor KvIndex::cursor(int r) const {
  const View& v = *views_[size_t(r)];
  std::shared_lock lock(v.mu);
  return {v.epoch, v.seq};
}

void KvIndex::apply(int r, const KvEventPage& page) {
  View& v = *views_[size_t(r)];
  std::unique_lock lock(v.mu);
  // Events continue the state they were read after: those of another epoch than ours (a read that
  // crossed a reset) cannot be applied; the next read asks for a snapshot.
  if (!page.snapshot && (page.epoch != v.epoch || !v.live)) {
    v.epoch = 0;
    return;
  }
  if (page.snapshot) {
    v.tiers.clear();
    if (page.epoch != v.seen_epoch) ++v.epochs;
    v.epoch = v.seen_epoch = page.epoch;
  }
  for (const KvEvent& e : page.events) {
    const uint8_t bit = uint8_t(1u << unsigned(e.tier));
    if (e.stored) {
      v.tiers[e.block] |= bit;
      continue;
    }
    auto it = v.tiers.find(e.block);
    if (it == v.tiers.end()) continue;
    it->second &= uint8_t(~bit);
    if (it->second == 0) v.tiers.erase(it);
  }
  v.seq = page.seq;
  v.live = true;
}

void KvIndex::reset(int r) {
  View& v = *views_[size_t(r)];
  std::unique_lock lock(v.mu);
  v.tiers.clear();
  v.live = false;
  v.epoch = 0;  // the next read asks for a snapshot
  v.seq = 0;
}

bool KvIndex::live(int r) const {
  const View& v = *views_[size_t(r)];
  std::shared_lock lock(v.mu);
  return v.live;
}

TierMatch KvIndex::match(int r, const std::vector<BlockHash>& hashes) const {
  const View& v = *views_[size_t(r)];
  TierMatch m;
  std::shared_lock lock(v.mu);
  for (const BlockHash& h : hashes) {
    auto it = v.tiers.find(h);
    if (it == v.tiers.end()) break;  // a lookup walks the chain from the first block
    ++m.blocks;
    const uint8_t bits = it->second;
    if (bits & (1u << unsigned(KvEventTier::kDevice))) continue;
    if (bits & (1u << unsigned(KvEventTier::kHost)))
      ++m.host;
    else
      ++m.disk;
  }
  return m;
}

size_t KvIndex::blocks(int r) const {
  const View& v = *views_[size_t(r)];
  std::shared_lock lock(v.mu);
  return v.tiers.size();
}

uint64_t KvIndex::epochs_seen(int r) const {
  const View& v = *views_[size_t(r)];
  std::shared_lock lock(v.mu);
  return v.epochs;
}

}  // namespace beluga::router
