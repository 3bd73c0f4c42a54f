// KvTransfer: how a prefill engine hands a request's KV blocks to the decode engine picked for it
// (DESIGN.md §3: the KV connector's prefill -> decode side). The blocks are host images, as the
// tiers keep them (block_bytes each, named by the engine's chained block hash); the decode side
// stores them in its host tier, where its scheduler's lookup finds them like any cached prefix. So a
// block that does not arrive costs recomputation on the decode side, never a wrong answer.
// TCP is the first implementation (tcp_kv_transfer.h); GPU-direct paths (NCCL, UCX, NIXL) implement
// the same call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "engine/block_manager.h"

namespace beluga::kv {

struct OutgoingBlock {
  BlockHash key;          // the engine's chained block hash
  const std::byte* data;  // block_bytes of host memory, valid for the call
};

struct TransferResult {
  bool ok = false;     // every block was sent and the receiver answered
  int accepted = 0;    // blocks the receiver stored (or held already)
  int64_t bytes = 0;   // payload bytes sent
  double seconds = 0;  // connect to answer
  std::string error;   // why not ok
};

class KvTransfer {
 public:
  virtual ~KvTransfer() = default;
  // Sends `blocks` (a chain's leading blocks, in order) of retention class `cls` to `dest`
  // ("host:port"); blocks the calling thread until the receiver answered or the transfer failed.
  virtual TransferResult send(const std::string& dest, const std::string& cls,
                              std::span<const OutgoingBlock> blocks) = 0;
};

}  // namespace beluga::kv
