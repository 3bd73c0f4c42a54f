// KvConnector: the one seam through which KV leaves or enters the engine's device pool (DESIGN.md §3).
// The engine knows only this interface; the tiers below the device pool (host memory, files) and,
// later, prefill -> decode transfers are implementations of it (src/kvstore).
//
// A block is named by the engine's chained block hash (block_manager.h: prefix, tokens, tenant salt);
// an implementation extends it with its model fingerprint so that other models never match.
// Every block moves as one contiguous host image of block_bytes() bytes: each layer's slice of the
// block, layer after layer (Ops::kv_block_to_host), then, for an engine speculating with the MTP
// module, the MTP layer's slice (its cache shares the main cache's block tables): a block loaded from
// below then gives the drafts the context a block kept in the device pool gives
// (kv_block_image_bytes).
//
// Protocol (all calls on the engine thread, except that the runner thread reads and writes the host
// memory of the copies handed out, between the launch of a step and its end):
//   scheduler: lookup() how many leading blocks sit below; start_load() them into device blocks the
//     engine allocated; poll load_ready() each step (a sequence whose load is not ready is simply not
//     scheduled); finish_load() hands the step's host -> device copies; cancel_load() when the request
//     goes away first.
//   admission: touch() the blocks found in the device pool (their copies below are in use too).
//   commit: start_save() for each block a step filled; it returns where the runner copies it (or
//     nothing when the block is stored already). Speculative decoding publishes a block of accepted
//     drafts only once the step that computed it is verified: its save goes with the next step and
//     is copied before that step's loads and forward (KvStepCopies::saves_first).
//   runner: the engine hands the step's copies (finish_load's and start_save's) to the runner with the
//     launch and says step_launched(); step_done(ok) once that step has finished (its host memory may
//     be reused, its saves become visible; a failed step's saves are dropped). One step is in flight
//     at a time; copies handed out after step_launched() belong to the next step. (A step the
//     engine launches early, before the one ahead is applied, carries no loads and counts as
//     launched only once it is committed, after the step ahead's step_done: its saves follow it to
//     the runner then, which copies them after its forward.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "engine/block_manager.h"
#include "engine/spec_config.h"

namespace beluga {

enum class KvTier : uint8_t { kDevice, kHost, kDisk };
const char* kv_tier_name(KvTier t);  // "device", "host", "disk"

// One block's copy between a device block and host memory, done by the runner (a step's copies go
// to the backend at once: Ops::kv_blocks_to_host / kv_blocks_from_host).
using KvCopy = KvBlockCopy;

// A step's copies: loads run before the forward, saves after it (a failed forward saves nothing).
// saves_first: blocks an earlier step computed (published once verified), copied before the loads,
// so that nothing this step writes can reach them first.
struct KvStepCopies {
  std::vector<KvCopy> loads, saves, saves_first;
  bool empty() const { return loads.empty() && saves.empty() && saves_first.empty(); }
  void clear() {
    loads.clear();
    saves.clear();
    saves_first.clear();
  }
};

class Model;
// The bytes of one block's image for an engine serving `m` with speculation `spec`: every layer's
// slice of the main cache, plus the MTP layer's when `spec` drafts with the MTP module.
size_t kv_block_image_bytes(const Model& m, const SpecConfig& spec);

class KvConnector {
 public:
  using LoadId = int64_t;

  virtual ~KvConnector() = default;
  virtual size_t block_bytes() const = 0;

  // How many of the leading `n` blocks of `keys` are available below the device pool; the tier of
  // each is written to tiers[0..result) when `tiers` is given. A hint: a later load may get fewer.
  virtual int lookup(const BlockHash* keys, int n, KvTier* tiers) = 0;
  // Starts fetching the blocks `keys[0..n)` for the device blocks `blocks[0..n)`, for a request of
  // traffic class `cls` (the blocks' retention becomes the longer of theirs and cls's).
  virtual LoadId start_load(const BlockHash* keys, const int* blocks, int n, const std::string& cls) = 0;
  // Whether the load has finished fetching (never blocks).
  virtual bool load_ready(LoadId id) = 0;
  // For a ready load: appends the host -> device copies of its leading blocks that were found to
  // `copies` and returns their number (0..n: a block that turned out missing or corrupt ends the run);
  // the tier each came from is written to tiers[0..result) when `tiers` (room for n) is given.
  // The load is then over; its host memory stays valid until the step it is launched with is done.
  virtual int finish_load(LoadId id, std::vector<KvCopy>& copies, KvTier* tiers) = 0;
  // The request went away before finish_load (never after it).
  virtual void cancel_load(LoadId id) = 0;

  // Device block `block` now holds the prefix `key` (computed by the step being built): returns the
  // host memory the runner copies it to, or nullptr when the block needs no saving.
  virtual std::byte* start_save(const BlockHash& key, const std::string& cls) = 0;
  // Blocks `keys[0..n)` were served from the device pool to a request of class `cls`: their copies
  // below count as used now (and keep the longer retention).
  virtual void touch(const BlockHash* keys, int n, const std::string& cls) = 0;

  // The copies handed out so far go with the step just launched.
  virtual void step_launched() = 0;
  // The step launched last has finished: ok = its forward and copies succeeded.
  virtual void step_done(bool ok) = 0;
};

}  // namespace beluga
