// The KV tier options of `beluga serve` (and `beluga bench kv`): --kv-host-gb G (a host-memory tier of
// G GiB, fractions allowed), --kv-disk-dir DIR (a file tier there) and --kv-disk-gb G (its capacity;
// default: the file system's free space). A tier is off when its flag is absent. Builds the store
// with the loaded model's fingerprint.
#pragma once

#include <memory>

#include "cli/args.h"
#include "cli/model_args.h"
#include "kvstore/tiered_store.h"

namespace beluga::cli {

inline constexpr const char* kKvUsage =
    "                    [--kv-host-gb G] [--kv-disk-dir DIR] [--kv-disk-gb G]\n";

// nullptr when no tier is asked for.
std::unique_ptr<kv::TieredStore> kv_store_from_args(const Args& args, const LoadedModel& m);

}  // namespace beluga::cli
