// What the cache-aware policy knows of each candidate's cache for one prompt: the leading blocks it
// holds and in which tier, exactly from its block events (KvIndex) when it publishes them and the
// router has read them, else the approximate PrefixIndex's guess (all of it priced as device). Block
// events lag routing by up to a poll interval (and a prompt's blocks appear only once computed), so a
// live replica is also credited with what was routed to it within the last `recent_ms` (priced as
// device), when that is more: a conversation's next turn, sent right after the last one, follows it.
#pragma once

#include <vector>

#include "router/router_context.h"

namespace beluga::router {

// Sets matched_blocks, host_blocks and disk_blocks of every candidate; `scratch` and `recent` are
// reused storage. Times in ms on the clock PrefixIndex::record() was given.
void match_candidates(const RouterContext& ctx, const std::vector<BlockHash>& hashes,
                      std::vector<Candidate>& candidates, std::vector<int>& scratch, std::vector<int>& recent,
                      int64_t now_ms, int64_t recent_ms);

}  // namespace beluga::router
