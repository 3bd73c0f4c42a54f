// BlockManager: the paged KV cache's blocks (kKvBlockSize tokens each), their reference counts, and
// the prefix index. A full block's key is h_i = XXH3-128(h_{i-1} | tokens of block i | salt), so a key
// names the whole prefix up to that block for one tenant. Freed blocks go to an LRU list and stay
// findable until they are reused, uncached blocks first. An event sink (kv_events.h), when given,
// hears every block that enters or leaves the prefix index (tier device).
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

namespace beluga {

struct BlockHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const BlockHash& o) const { return lo == o.lo && hi == o.hi; }
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const { return size_t(h.lo ^ (h.hi * 0x9e3779b97f4a7c15ull)); }
};

// The key of the block holding tokens[0..kKvBlockSize) after the prefix named `prev` ({} for none).
BlockHash chain_hash(const BlockHash& prev, const int* tokens, const std::string& salt);
// The chain of keys of the first `max_blocks` full blocks of `tokens`.
std::vector<BlockHash> block_hashes(const std::vector<int>& tokens, const std::string& salt,
                                    size_t max_blocks);

class KvEventSink;

class BlockManager {
 public:
  // `events`: not owned, may be null; outlives the manager.
  BlockManager(int num_blocks, bool prefix_caching, KvEventSink* events = nullptr);

  int num_blocks() const { return int(ref_.size()); }
  int num_free() const { return int(free_.size()); }
  int num_used() const { return num_blocks() - num_free(); }
  bool is_published(int block) const { return has_hash_[size_t(block)]; }  // in the prefix index

  // The longest run of cached blocks matching `hashes` from the start; takes a reference on each.
  std::vector<int> acquire_prefix(const std::vector<BlockHash>& hashes);
  // Grows `table` to hold `tokens` tokens; false (and no change) when not enough blocks are free.
  bool grow(std::vector<int>& table, int tokens);
  // Records that block `block` is full with the prefix named `hash` (later requests may share it).
  void publish(int block, const BlockHash& hash);
  // Takes `block` out of the prefix index (its contents turned out not to be valid); no-op when it is
  // not there.
  void unpublish(int block);
  // Drops one reference on every block of `table` and clears it; of the blocks that become free,
  // the table's last is evicted first and its first last.
  void release(std::vector<int>& table);

 private:
  int take_free();
  void drop_from_index(int block);  // the block leaves the prefix index (has_hash_ still set)

  bool caching_;
  KvEventSink* events_;
  std::vector<int> ref_;
  std::vector<bool> has_hash_;
  std::vector<BlockHash> hash_;
  std::list<int> free_;  // front: reused first
  std::vector<std::list<int>::iterator> free_pos_;
  std::vector<bool> in_free_;
  std::unordered_map<BlockHash, int, BlockHashHasher> index_;
};

}  // namespace beluga
