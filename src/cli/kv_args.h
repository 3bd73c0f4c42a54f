// The KV tier options of `beluga serve` (and `beluga bench kv`): --kv-host-gb G (a host-memory tier of
// G GiB, fractions allowed), --kv-disk-dir DIR (a file tier there), --kv-disk-gb G (its capacity;
// default: the file system's free space) and --kv-retention chat=7d,agent=3d (the classes a request
// may name, tiers on or off, and how long the file tier keeps their blocks after their last use).
// A tier is off when its flag is absent. The store is keyed with the loaded model's fingerprint.
// --kv-disk-io auto|io_uring|threads picks the file tier's I/O path (auto: io_uring when the kernel
// allows it) and --kv-disk-sync none|data|full how its block files are synced (block_file.h).
#pragma once

#include <memory>

#include "cli/args.h"
#include "cli/model_args.h"
#include "engine/spec_config.h"
#include "kvstore/retention.h"
#include "kvstore/tiered_store.h"

namespace beluga::cli {

// What the flags ask for: read and checked before anything loads.
struct KvFlags {
  kv::Retention retention;
  double host_gb = 0, disk_gb = 0;
  std::string disk_dir;
  kv::DiskIoOptions disk_io;
};
KvFlags parse_kv_flags(const Args& args);

struct KvOptions {
  kv::Retention retention;
  std::unique_ptr<kv::TieredStore> store;  // nullptr when no tier is asked for
};
// The tiers the flags ask for, keyed with the loaded model's fingerprint; their blocks are the
// images an engine with speculation `spec` moves (kv_block_image_bytes); `events` (null: none)
// hears their block events and outlives the store.
KvOptions open_kv_tiers(const KvFlags& f, const LoadedModel& m, const SpecConfig& spec,
                        KvEventSink* events = nullptr);

}  // namespace beluga::cli
