#include "engine/block_manager.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "engine/kv_events.h"
#include "model/batch.h"
#include "util/error.h"

namespace beluga {

BlockHash chain_hash(const BlockHash& prev, const int* tokens, const std::string& salt) {
  unsigned char buf[16 + kKvBlockSize * 4];
  std::memcpy(buf, &prev.lo, 8);
  std::memcpy(buf + 8, &prev.hi, 8);
  for (int i = 0; i < kKvBlockSize; ++i) {
    const int32_t t = tokens[i];
    std::memcpy(buf + 16 + 4 * i, &t, 4);
  }
  XXH3_state_t st;
  XXH3_128bits_reset(&st);
  XXH3_128bits_update(&st, buf, sizeof(buf));
  XXH3_128bits_update(&st, salt.data(), salt.size());
  const XXH128_hash_t h = XXH3_128bits_digest(&st);
  return {h.low64, h.high64};
}

std::vector<BlockHash> block_hashes(const std::vector<int>& tokens, const std::string& salt,
                                    size_t max_blocks) {
  std::vector<BlockHash> out;
  const size_t n = std::min(max_blocks, tokens.size() / kKvBlockSize);
  BlockHash prev;
  for (size_t b = 0; b < n; ++b)
    out.push_back(prev = chain_hash(prev, tokens.data() + b * kKvBlockSize, salt));
  return out;
}

BlockManager::BlockManager(int num_blocks, bool prefix_caching, KvEventSink* events, int partitions)
    : caching_(prefix_caching),
      events_(events),
      per_part_(partitions > 0 ? num_blocks / partitions : 0),
      ref_(num_blocks, 0),
      has_hash_(num_blocks, false),
      hash_(num_blocks),
      parts_(size_t(std::max(partitions, 1))),
      free_pos_(num_blocks),
      in_free_(num_blocks, false) {
  BELUGA_CHECK(num_blocks > 0, "the KV cache needs at least one block");
  BELUGA_CHECK(partitions >= 1 && num_blocks % partitions == 0, "the KV cache's ", num_blocks,
               " blocks do not split into ", partitions, " equal partitions");
  for (int b = 0; b < num_blocks; ++b) to_free(b, false);
}

void BlockManager::to_free(int block, bool front) {
  std::list<int>& f = parts_[size_t(partition_of(block))].free;
  free_pos_[size_t(block)] = front ? f.insert(f.begin(), block) : f.insert(f.end(), block);
  in_free_[size_t(block)] = true;
  ++free_total_;
}

void BlockManager::out_of_free(int block) {
  parts_[size_t(partition_of(block))].free.erase(free_pos_[size_t(block)]);
  in_free_[size_t(block)] = false;
  --free_total_;
}

int BlockManager::take_free(int partition) {
  const int b = parts_[size_t(partition)].free.front();
  out_of_free(b);
  if (has_hash_[b]) {  // evict the LRU cached block: it is about to hold other tokens
    drop_from_index(b);
    has_hash_[b] = false;
  }
  ref_[b] = 1;
  return b;
}

BlockManager::Run BlockManager::cached_run(int p, const std::vector<BlockHash>& hashes) const {
  const auto& index = parts_[size_t(p)].index;
  Run run{{}, num_free(p)};
  for (const BlockHash& h : hashes) {
    const auto it = index.find(h);
    if (it == index.end()) break;
    run.blocks.push_back(it->second);
    if (in_free_[size_t(it->second)]) --run.free_after;
  }
  return run;
}

std::vector<int> BlockManager::acquire_prefix(const std::vector<BlockHash>& hashes, int tokens) {
  if (!caching_ || hashes.empty()) return {};
  const int need = (tokens + kKvBlockSize - 1) / kKvBlockSize;
  Run best;
  int best_p = -1;
  bool best_fits = false;
  for (int p = 0; p < num_partitions(); ++p) {
    Run run = cached_run(p, hashes);
    const int len = int(run.blocks.size());
    const bool fits = num_partitions() == 1 || tokens <= 0 || run.free_after >= need - len;
    if (best_p < 0 || std::make_tuple(fits, len, num_free(p)) >
                          std::make_tuple(best_fits, int(best.blocks.size()), num_free(best_p)))
      best = std::move(run), best_p = p, best_fits = fits;
  }
  for (const int b : best.blocks) {
    if (in_free_[b]) out_of_free(b);
    ref_[b]++;
  }
  return std::move(best.blocks);
}

bool BlockManager::grow(std::vector<int>& table, int tokens) {
  const int need = (tokens + kKvBlockSize - 1) / kKvBlockSize - int(table.size());
  if (need <= 0) return true;
  int part = 0;
  if (!table.empty()) {
    part = partition_of(table.front());
  } else {
    for (int p = 1; p < num_partitions(); ++p)
      if (num_free(p) > num_free(part)) part = p;
  }
  if (need > num_free(part)) return false;
  for (int i = 0; i < need; ++i) table.push_back(take_free(part));
  return true;
}

void BlockManager::publish(int block, const BlockHash& hash) {
  if (!caching_ || has_hash_[block]) return;
  auto [it, inserted] = parts_[size_t(partition_of(block))].index.emplace(hash, block);
  if (!inserted) return;  // another block already holds this prefix; keep the first
  has_hash_[block] = true;
  hash_[block] = hash;
  if (num_partitions() > 1 && copies_[hash]++ > 0) return;  // another partition holds it too
  if (events_) events_->stored(KvEventTier::kDevice, hash);
}

void BlockManager::drop_from_index(int block) {
  auto& index = parts_[size_t(partition_of(block))].index;
  const BlockHash& h = hash_[size_t(block)];
  auto it = index.find(h);
  if (it == index.end() || it->second != block) return;
  index.erase(it);
  if (num_partitions() > 1) {
    auto c = copies_.find(h);
    if (--c->second > 0) return;
    copies_.erase(c);
  }
  if (events_) events_->removed(KvEventTier::kDevice, h);
}

void BlockManager::unpublish(int block) {
  if (!has_hash_[block]) return;
  drop_from_index(block);
  has_hash_[block] = false;
  if (in_free_[block]) {  // now a plain free block: reused first
    out_of_free(block);
    to_free(block, true);
  }
}

void BlockManager::release(std::vector<int>& table) {
  // Last block first: cached blocks queue at the back (least recently used first out), so the
  // prefix's head lands behind its tail and is evicted last. Evicting the head first would leave the
  // rest of the chain cached but unreachable (a lookup walks the chain from the first block).
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const int b = *it;
    BELUGA_ASSERT(ref_[b] > 0);
    if (--ref_[b] == 0) to_free(b, !has_hash_[b]);  // plain (unpublished) blocks are reused first
  }
  table.clear();
}

}  // namespace beluga
