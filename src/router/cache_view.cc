#include "router/cache_view.h"

namespace beluga::router {

void match_candidates(const RouterContext& ctx, const std::vector<BlockHash>& hashes,
                      std::vector<Candidate>& candidates, std::vector<int>& scratch) {
  bool approximate = false;
  for (auto& c : candidates) {
    if (!ctx.kv_index.live(c.replica)) {
      approximate = true;
      continue;
    }
    const TierMatch m = ctx.kv_index.match(c.replica, hashes);
    c.matched_blocks = m.blocks;
    c.host_blocks = m.host;
    c.disk_blocks = m.disk;
  }
  if (!approximate) return;
  ctx.index.match(hashes, int(ctx.replicas.size()), scratch);
  for (auto& c : candidates)
    if (!ctx.kv_index.live(c.replica)) c.matched_blocks = scratch[size_t(c.replica)];
}

}  // namespace beluga::router
