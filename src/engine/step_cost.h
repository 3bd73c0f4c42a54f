// StepCost: an online model of one engine step's duration, cost(tokens) ≈ a + b·tokens, fit by least
// squares over the measured steps with exponential forgetting (each new step weighs 1, the one
// before it `decay`, ...), so the fit follows a machine whose speed drifts (other load, a longer
// context) without a window to keep.
//
// Contract:
//   - observe(tokens, seconds) adds one measured step (tokens > 0, seconds >= 0).
//   - fitted() once at least kMinSteps steps are in and their token counts differ (a slope needs two
//     distinct x values); before that a() and b() are 0 and tokens_within() says "unknown" (-1).
//   - tokens_within(s): the largest token count whose predicted cost is <= s (0 when even the fixed
//     cost a is over s; INT_MAX when the fitted slope is not positive and a <= s).
//   - Once fitted, an observation is capped at 2·predict(tokens) + 1 ms (a stalled step on a shared
//     machine does not set the fixed cost).
//   - Exact on points that lie on a line, whatever the decay (tests rely on it).
#pragma once

#include <cstdint>

namespace beluga {

class StepCost {
 public:
  static constexpr int kMinSteps = 4;
  explicit StepCost(double decay = 0.98);

  void observe(int tokens, double seconds);
  bool fitted() const { return fitted_; }
  double a() const { return a_; }  // seconds per step
  double b() const { return b_; }  // seconds per token
  double predict(int tokens) const { return a_ + b_ * tokens; }
  int64_t steps() const { return steps_; }
  int tokens_within(double seconds) const;

 private:
  double decay_;
  double w_ = 0, x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;  // decayed sums: weight, x, y, x², x·y
  double a_ = 0, b_ = 0;
  bool fitted_ = false;
  int64_t steps_ = 0;
};

}  // namespace beluga
