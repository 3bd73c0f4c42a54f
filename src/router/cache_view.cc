#include "router/cache_view.h"

#include <algorithm>

namespace beluga::router {

void match_candidates(const RouterContext& ctx, const std::vector<BlockHash>& hashes,
                      std::vector<Candidate>& candidates, std::vector<int>& scratch, std::vector<int>& recent,
                      int64_t now_ms, int64_t recent_ms) {
  const int n = int(ctx.replicas.size());
  bool approximate = false;
  for (const auto& c : candidates) approximate |= !ctx.kv_index.live(c.replica);
  if (approximate) ctx.index.match(hashes, n, scratch);    // replicas without events: all routed to them
  ctx.index.match(hashes, n, recent, now_ms - recent_ms);  // live ones: what was routed lately
  for (auto& c : candidates) {
    if (!ctx.kv_index.live(c.replica)) {
      c.matched_blocks = scratch[size_t(c.replica)];
      continue;
    }
    const TierMatch m = ctx.kv_index.match(c.replica, hashes);
    c.matched_blocks = std::max(m.blocks, recent[size_t(c.replica)]);
    c.host_blocks = m.host;
    c.disk_blocks = m.disk;
  }
}

}  // namespace beluga::router
