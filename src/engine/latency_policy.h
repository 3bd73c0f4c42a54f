// LatencyPolicy: how much prefill one engine step may carry, and in what order waiting prompts are
// admitted, so that running decodes keep their inter-token latency while prompts arrive.
//
// Prefill budget (itl_target_ms > 0): decodes go first; the step's prefill tokens are what the fitted
// step cost (StepCost) leaves under the step time after the decode tokens:
//     step = max(target, 2 * cost(decode_tokens))
//     budget = clamp(tokens_within(step) - decode_tokens, min(min_prefill_tokens, room), room)
// with room = cap - decode_tokens (cap: --max-num-batched-tokens). The 2x term gives prefill at least
// the decodes' own step time when the decodes alone take half the target or more (a target out of
// reach would otherwise leave prefill the minimum share while ITL misses the target anyway). Without decodes,
// before the cost is fitted, or with the target off, the budget is `room`: today's behaviour.
// min_prefill_tokens is the share prefill always gets while any prompt waits, so a prompt of P tokens behind
// Q queued prompt tokens starts decoding within ceil((P + Q) / min_prefill_tokens) steps whatever the decode
// load.
//
// Admission (ttft_slo_ms > 0): waiting prompts are taken shortest first (fewest prompt tokens), except
// that one which has waited ttft_slo_ms or more goes ahead of the others (those in arrival order).
// Sequences that were running before (preempted) keep their place at the front. With a common
// deadline (a burst), shortest-first maximizes the number of prompts whose prefill ends before it;
// the aging rule bounds how long a long prompt can be passed over. Off: arrival order (today's).
#pragma once

#include "engine/step_cost.h"

namespace beluga {

struct LatencyConfig {
  double itl_target_ms = 0;     // 0: off (the budget is --max-num-batched-tokens)
  double ttft_slo_ms = 0;       // 0: off (arrival order)
  int min_prefill_tokens = 64;  // prefill tokens a step may always carry under the ITL target
  bool budget_on() const { return itl_target_ms > 0; }
  bool admission_on() const { return ttft_slo_ms > 0; }
};

class LatencyPolicy {
 public:
  explicit LatencyPolicy(const LatencyConfig& cfg);

  const LatencyConfig& config() const { return cfg_; }
  StepCost& cost() { return cost_; }
  const StepCost& cost() const { return cost_; }
  // A finished step: its batch tokens (prefill + decode + drafts) and forward seconds.
  void observe(int tokens, double seconds) { cost_.observe(tokens, seconds); }
  // This step's prefill tokens, the decodes having taken `decode_tokens` of the cap `cap`.
  int prefill_budget(int decode_tokens, int cap) const;
  // Admission: true when `a` goes before `b`; waited_* are seconds in the queue, len_* prompt tokens.
  bool admits_before(double waited_a, int len_a, double waited_b, int len_b) const;

 private:
  LatencyConfig cfg_;
  StepCost cost_;
};

}  // namespace beluga
