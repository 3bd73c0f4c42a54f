#include "engine/kv_events.h"

#include <algorithm>
#include <random>

namespace beluga {

const char* kv_event_tier_name(KvEventTier t) {
  switch (t) {
    case KvEventTier::kDevice:
      return "device";
    case KvEventTier::kHost:
      return "host";
    case KvEventTier::kDisk:
      return "disk";
  }
  return "?";
}

namespace {

uint64_t random_epoch() {
  std::random_device rd;
  uint64_t e = 0;
  while (e == 0) e = (uint64_t(rd()) << 32) ^ rd();
  return e;
}

}  // namespace

KvEventLog::KvEventLog(size_t ring_capacity, uint64_t epoch)
    : epoch_(epoch ? epoch : random_epoch()), ring_(std::max<size_t>(1, ring_capacity)) {}

uint64_t KvEventLog::seq() const {
  std::lock_guard lock(mu_);
  return seq_;
}

size_t KvEventLog::held_blocks() const {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (const auto& [h, bits] : held_) n += size_t(__builtin_popcount(bits));
  return n;
}

void KvEventLog::append(KvEventTier tier, const BlockHash& block, bool stored) {
  ++seq_;
  ring_[(seq_ - 1) % ring_.size()] = KvEvent{seq_, block, tier, stored};
}

void KvEventLog::stored(KvEventTier tier, const BlockHash& block) {
  const uint8_t bit = uint8_t(1u << unsigned(tier));
  std::lock_guard lock(mu_);
  uint8_t& bits = held_[block];
  if (bits & bit) return;  // already held there: nothing changed for a reader
  bits |= bit;
  append(tier, block, true);
}

void KvEventLog::removed(KvEventTier tier, const BlockHash& block) {
  const uint8_t bit = uint8_t(1u << unsigned(tier));
  std::lock_guard lock(mu_);
  auto it = held_.find(block);
  if (it == held_.end() || !(it->second & bit)) return;
  it->second &= uint8_t(~bit);
  if (it->second == 0) held_.erase(it);
  append(tier, block, false);
}

KvEventPage KvEventLog::read(uint64_t epoch, uint64_t after, size_t max_events) const {
  KvEventPage page;
  page.epoch = epoch_;
  std::lock_guard lock(mu_);
  const uint64_t oldest = seq_ > ring_.size() ? seq_ - ring_.size() + 1 : 1;  // in the ring
  if (epoch != epoch_ || after > seq_ || after + 1 < oldest) {
    page.snapshot = true;
    page.seq = seq_;
    page.events.reserve(held_.size());
    for (const auto& [h, bits] : held_)
      for (int t = 0; t < kNumKvEventTiers; ++t)
        if (bits >> t & 1) page.events.push_back(KvEvent{seq_, h, KvEventTier(t), true});
    return page;
  }
  const uint64_t last = std::min(seq_, after + uint64_t(std::max<size_t>(1, max_events)));
  page.events.reserve(size_t(last - after));
  for (uint64_t s = after + 1; s <= last; ++s) page.events.push_back(ring_[(s - 1) % ring_.size()]);
  page.seq = last;
  page.more = last < seq_;
  return page;
}

}  // namespace beluga
