#include "engine/block_manager.h"

#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <cstring>

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

BlockManager::BlockManager(int num_blocks, bool prefix_caching, KvEventSink* events)
    : caching_(prefix_caching),
      events_(events),
      ref_(num_blocks, 0),
      has_hash_(num_blocks, false),
      hash_(num_blocks),
      free_pos_(num_blocks),
      in_free_(num_blocks, true) {
  BELUGA_CHECK(num_blocks > 0, "the KV cache needs at least one block");
  for (int b = 0; b < num_blocks; ++b) free_pos_[b] = free_.insert(free_.end(), b);
}

int BlockManager::take_free() {
  const int b = free_.front();
  free_.pop_front();
  in_free_[b] = false;
  if (has_hash_[b]) {  // evict the LRU cached block: it is about to hold other tokens
    drop_from_index(b);
    has_hash_[b] = false;
  }
  ref_[b] = 1;
  return b;
}

std::vector<int> BlockManager::acquire_prefix(const std::vector<BlockHash>& hashes) {
  std::vector<int> blocks;
  if (!caching_) return blocks;
  for (const BlockHash& h : hashes) {
    auto it = index_.find(h);
    if (it == index_.end()) break;
    const int b = it->second;
    if (in_free_[b]) {
      free_.erase(free_pos_[b]);
      in_free_[b] = false;
    }
    ref_[b]++;
    blocks.push_back(b);
  }
  return blocks;
}

bool BlockManager::grow(std::vector<int>& table, int tokens) {
  const int need = (tokens + kKvBlockSize - 1) / kKvBlockSize - int(table.size());
  if (need <= 0) return true;
  if (need > num_free()) return false;
  for (int i = 0; i < need; ++i) table.push_back(take_free());
  return true;
}

void BlockManager::publish(int block, const BlockHash& hash) {
  if (!caching_ || has_hash_[block]) return;
  auto [it, inserted] = index_.emplace(hash, block);
  if (!inserted) return;  // another block already holds this prefix; keep the first
  has_hash_[block] = true;
  hash_[block] = hash;
  if (events_) events_->stored(KvEventTier::kDevice, hash);
}

void BlockManager::drop_from_index(int block) {
  auto it = index_.find(hash_[size_t(block)]);
  if (it == index_.end() || it->second != block) return;
  index_.erase(it);
  if (events_) events_->removed(KvEventTier::kDevice, hash_[size_t(block)]);
}

void BlockManager::unpublish(int block) {
  if (!has_hash_[block]) return;
  drop_from_index(block);
  has_hash_[block] = false;
  if (in_free_[block]) {  // now a plain free block: reused first
    free_.erase(free_pos_[block]);
    free_pos_[block] = free_.insert(free_.begin(), block);
  }
}

void BlockManager::release(std::vector<int>& table) {
  // Last block first: cached blocks queue at the back (least recently used first out), so the
  // prefix's head lands behind its tail and is evicted last. Evicting the head first would leave the
  // rest of the chain cached but unreachable (a lookup walks the chain from the first block).
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    const int b = *it;
    BELUGA_ASSERT(ref_[b] > 0);
    if (--ref_[b] == 0) {
      // Plain (unpublished) blocks are reused first.
      free_pos_[b] = has_hash_[b] ? free_.insert(free_.end(), b) : free_.insert(free_.begin(), b);
      in_free_[b] = true;
    }
  }
  table.clear();
}

}  // namespace beluga
