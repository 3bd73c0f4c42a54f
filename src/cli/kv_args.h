// The KV tier options of `beluga serve` (and `beluga bench kv`): --kv-host-gb G (a host-memory tier of
// G GiB, fractions allowed; off when absent). Builds the store with the loaded model's fingerprint.
#pragma once

#include <memory>

#include "cli/args.h"
#include "cli/model_args.h"
#include "kvstore/tiered_store.h"

namespace beluga::cli {

inline constexpr const char* kKvUsage = "                    [--kv-host-gb G]\n";

// nullptr when no tier is asked for.
std::unique_ptr<kv::TieredStore> kv_store_from_args(const Args& args, const LoadedModel& m);

}  // namespace beluga::cli
