// The KV tiers' /metrics lines (Prometheus text), labelled tier="device|host|disk" and, for what the
// file tier holds, class: hits, misses, bytes read and written, load time, evictions, expirations,
// errors, blocks and bytes held, capacity.
#pragma once

#include <string>

#include "engine/engine.h"
#include "kvstore/tiered_store.h"

namespace beluga::kv {

std::string render_metrics(TieredStore& store, const EngineStats& engine, const std::string& model);

}  // namespace beluga::kv
