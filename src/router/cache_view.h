// What the cache-aware policy knows of each candidate's cache for one prompt: the leading blocks it
// holds and in which tier, exactly from its block events (KvIndex) when it publishes them and the
// router has read them, else the approximate PrefixIndex's guess (all of it priced as device).
#pragma once

#include <vector>

#include "router/router_context.h"

namespace beluga::router {

// Sets matched_blocks, host_blocks and disk_blocks of every candidate; `scratch` is reused storage.
void match_candidates(const RouterContext& ctx, const std::vector<BlockHash>& hashes,
                      std::vector<Candidate>& candidates, std::vector<int>& scratch);

}  // namespace beluga::router
