#include "router/decode_balance.h"

#include <limits>

namespace beluga::router {

size_t choose_decode(std::span<const Candidate> candidates, const CostKnobs& knobs, uint64_t ticket) {
  bool any_room = false;
  for (const Candidate& c : candidates) any_room = any_room || c.kv_usage < knobs.decode_kv_full;
  double best = std::numeric_limits<double>::infinity();
  size_t ties = 0;
  for (const Candidate& c : candidates) {
    if (any_room && c.kv_usage >= knobs.decode_kv_full) continue;
    const double cost = c.in_flight + knobs.decode_kv_requests * c.kv_usage;
    if (cost < best - 1e-9) {
      best = cost;
      ties = 1;
    } else if (cost <= best + 1e-9) {
      ++ties;
    }
  }
  size_t pick = ticket % ties;  // the pick-th of the tied cheapest, in candidate order
  for (size_t i = 0; i < candidates.size(); ++i) {
    const Candidate& c = candidates[i];
    if (any_room && c.kv_usage >= knobs.decode_kv_full) continue;
    const double cost = c.in_flight + knobs.decode_kv_requests * c.kv_usage;
    if (cost <= best + 1e-9 && pick-- == 0) return i;
  }
  return 0;
}

}  // namespace beluga::router
