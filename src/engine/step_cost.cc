#include "engine/step_cost.h"

#include <algorithm>
#include <climits>
#include <cmath>

#include "util/error.h"

namespace beluga {

StepCost::StepCost(double decay) : decay_(decay) {
  BELUGA_CHECK(decay > 0 && decay <= 1, "the step cost's decay must be in (0, 1]");
}

void StepCost::observe(int tokens, double seconds) {
  BELUGA_ASSERT(tokens > 0 && seconds >= 0);
  // Once fitted, a step is counted at no more than twice its prediction (plus 1 ms): on a shared
  // machine a step now and then stalls for a descheduled thread, and least squares would let one such
  // stall set the fixed cost. A machine that really slows down still moves the fit, at most 2x a step.
  const double x = tokens, y = fitted_ ? std::min(seconds, 2 * predict(tokens) + 1e-3) : seconds;
  w_ = w_ * decay_ + 1;
  x_ = x_ * decay_ + x;
  y_ = y_ * decay_ + y;
  xx_ = xx_ * decay_ + x * x;
  xy_ = xy_ * decay_ + x * y;
  ++steps_;
  // Centred: the spread of x about its weighted mean (tokens²); below half a token² the counts are all
  // (nearly) the same and the slope is noise.
  const double mx = x_ / w_;
  const double var = xx_ / w_ - mx * mx;
  if (steps_ < kMinSteps || var < 0.5) return;
  b_ = (xy_ / w_ - mx * (y_ / w_)) / var;
  a_ = y_ / w_ - b_ * mx;
  fitted_ = true;
}

int StepCost::tokens_within(double seconds) const {
  if (!fitted_) return -1;
  if (a_ > seconds) return 0;
  if (b_ <= 0) return INT_MAX;
  const double n = std::floor((seconds - a_) / b_ + 1e-9);  // 1e-9: exact budgets on exact fits
  return n >= double(INT_MAX) ? INT_MAX : int(n);
}

}  // namespace beluga
