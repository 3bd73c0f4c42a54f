// The KV tiers' /metrics lines (Prometheus text), labelled tier="device|host|disk": hits, misses,
// bytes read and written, load time, evictions, expirations, errors (write errors, no space, partial
// files of crashed writers removed), blocks and bytes held, capacity; prompt tokens served per tier
// and traffic_class (beluga_kv_hit_tokens_total); blocks held per tier and retention class.
#pragma once

#include <string>

#include "engine/engine.h"
#include "kvstore/tiered_store.h"

namespace beluga::kv {

std::string render_metrics(TieredStore& store, const EngineStats& engine, const std::string& model);

}  // namespace beluga::kv
