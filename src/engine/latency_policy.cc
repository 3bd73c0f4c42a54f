#include "engine/latency_policy.h"

#include <algorithm>

#include "util/error.h"

namespace beluga {

LatencyPolicy::LatencyPolicy(const LatencyConfig& cfg) : cfg_(cfg) {
  BELUGA_CHECK(cfg.itl_target_ms >= 0 && cfg.ttft_slo_ms >= 0, "latency targets must not be negative");
  BELUGA_CHECK(cfg.min_prefill_tokens > 0, "min_prefill_tokens must be positive");
}

int LatencyPolicy::prefill_budget(int decode_tokens, int cap) const {
  const int room = std::max(0, cap - decode_tokens);
  if (!cfg_.budget_on() || decode_tokens == 0 || !cost_.fitted()) return room;
  // Prefill always gets at least the decodes' own step time: when the decodes alone take over half
  // the target (or more than all of it), the step may run to twice their cost instead of shrinking
  // prefill to the minimum share for a target that is out of reach.
  const double step = std::max(cfg_.itl_target_ms * 1e-3, 2 * cost_.predict(decode_tokens));
  const int within = cost_.tokens_within(step);
  const int fit = within >= room + decode_tokens ? room : within - decode_tokens;
  return std::clamp(fit, std::min(cfg_.min_prefill_tokens, room), room);
}

bool LatencyPolicy::admits_before(double waited_a, int len_a, double waited_b, int len_b) const {
  const double slo = cfg_.ttft_slo_ms * 1e-3;
  const bool aged_a = waited_a >= slo, aged_b = waited_b >= slo;
  if (aged_a != aged_b) return aged_a;
  if (aged_a) return waited_a > waited_b;  // both overdue: the older first
  return len_a < len_b;
}

}  // namespace beluga
