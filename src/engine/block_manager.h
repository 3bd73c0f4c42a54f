// BlockManager: the paged KV cache's blocks (kKvBlockSize tokens each), their reference counts, and
// the prefix index. A full block's key is h_i = XXH3-128(h_{i-1} | tokens of block i | salt), so a key
// names the whole prefix up to that block for one tenant. Freed blocks go to an LRU list and stay
// findable until they are reused, uncached blocks first. An event sink (kv_events.h), when given,
// hears every block that enters or leaves the prefix index (tier device).
// Partitions (attention data parallelism, model/data_parallel_split.h): the blocks split into equal
// ranges, one per rank's cache; a sequence's blocks all come from one partition, chosen when its
// table is empty: the one with the longest cached prefix for it, else (and on ties) the one with the
// most free blocks. Each partition has its own free list and prefix index (a prefix may be cached in
// several); events hear a key when its first copy enters and when its last leaves.
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
  // `events`: not owned, may be null; outlives the manager. `partitions` must divide num_blocks.
  BlockManager(int num_blocks, bool prefix_caching, KvEventSink* events = nullptr, int partitions = 1);

  int num_blocks() const { return int(ref_.size()); }
  int num_partitions() const { return int(parts_.size()); }
  int blocks_per_partition() const { return per_part_; }
  int partition_of(int block) const { return block / per_part_; }
  int num_free() const { return free_total_; }
  int num_free(int partition) const { return int(parts_[size_t(partition)].free.size()); }
  int num_used() const { return num_blocks() - num_free(); }
  bool is_published(int block) const { return has_hash_[size_t(block)]; }  // in the prefix index

  // The longest run of cached blocks matching `hashes` from the start; takes a reference on each.
  // With partitions, `tokens` (> 0: what the sequence will hold) prefers the partitions where the rest
  // of it fits, then the longest run, then the most free blocks: a hot prefix does not hold a request
  // back behind a full partition while another has room to recompute it.
  std::vector<int> acquire_prefix(const std::vector<BlockHash>& hashes, int tokens = 0);
  // Grows `table` to hold `tokens` tokens, from its partition (an empty table's: the one with the
  // most free blocks); false (and no change) when not enough blocks are free there.
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
  struct Partition {
    std::list<int> free;  // front: reused first
    std::unordered_map<BlockHash, int, BlockHashHasher> index;
  };
  int take_free(int partition);
  void drop_from_index(int block);  // the block leaves the prefix index (has_hash_ still set)
  void to_free(int block, bool front);
  void out_of_free(int block);
  // The run of `hashes` cached in partition p (one pass over its index): its blocks, and how many
  // free blocks p would have left once it took them.
  struct Run {
    std::vector<int> blocks;
    int free_after = 0;
  };
  Run cached_run(int p, const std::vector<BlockHash>& hashes) const;

  bool caching_;
  KvEventSink* events_;
  int per_part_;
  int free_total_ = 0;
  std::vector<int> ref_;
  std::vector<bool> has_hash_;
  std::vector<BlockHash> hash_;
  std::vector<Partition> parts_;
  std::vector<std::list<int>::iterator> free_pos_;
  std::vector<bool> in_free_;
  // With several partitions: how many of them hold each key (events hear the first and the last).
  std::unordered_map<BlockHash, int, BlockHashHasher> copies_;
};

}  // namespace beluga
