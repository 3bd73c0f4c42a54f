// One forward step's work: every scheduled token of every sequence, flattened (prefill chunks and
// decode tokens mix freely), and where each sequence's KV lives in the paged cache.
#pragma once

#include <vector>

#include "tensor/tensor.h"

namespace beluga {

inline constexpr int kKvBlockSize = 64;

struct SeqChunk {
  int context_len = 0;           // tokens of this sequence already in the cache
  int query_len = 0;             // new tokens this step (their rows are consecutive in Batch::tokens)
  std::vector<int> block_table;  // cache blocks holding tokens [0, context_len + query_len)
};

struct Batch {
  std::vector<int> tokens;      // all new tokens, sequence after sequence
  std::vector<SeqChunk> seqs;   // in the same order
  std::vector<int> logit_rows;  // rows of `tokens` whose next-token logits the caller wants
};

// The paged cache of one model: per layer [num_blocks, kKvBlockSize, entry_dim] on the device
// (Model::kv_layout: some architectures keep more than one tensor per layer).
struct KvCache {
  std::vector<Tensor> layers;
  int num_blocks = 0;
};

}  // namespace beluga
