// GET /v1/kv/events?epoch=HEX&after=SEQ[&max=N]: the replica's KV block events (engine/kv_events.h)
// after event SEQ of epoch HEX, at most N (default 4096, at most 65536), as kv_event_json.h writes
// them; a snapshot of every held block when the epoch is another (a first read: omit it, or after=0
// with no epoch) or the events after SEQ have left the ring. A router polls it to keep an exact
// cache index per replica. 404 when `beluga serve` runs without block events; 503 while loading.
#pragma once

#include <string_view>

#include "engine/kv_events.h"
#include "server/utility_routes.h"

namespace beluga::server {

inline constexpr std::string_view kKvEventsPath = "/v1/kv/events";

// `target`: the request target with its query; `log`: null when events are off; `ready`: the model
// is loaded.
UtilityReply handle_kv_events_route(std::string_view target, std::string_view method, const KvEventLog* log,
                                    bool ready);

}  // namespace beluga::server
