#include "engine/spec_gate.h"

#include <algorithm>

#include "model/decode_graphs.h"
#include "util/error.h"

namespace beluga {

namespace {

constexpr double kCostWeight = 0.2;  // of a new period in the moving average
constexpr double kDecay = 0.995;     // of the acceptance counts per observation
constexpr double kOutlier = 4.0;     // periods this many times the average are dropped (stalls)
constexpr double kPriorTried = 2.0;  // prior pseudo-counts: acceptance 1/2 until measured
constexpr double kPriorPassed = 1.0;

}  // namespace

SpecGate::SpecGate(int max_k, bool fixed)
    : max_k_(max_k), fixed_(fixed), tried_(size_t(max_k), 0.0), passed_(size_t(max_k), 0.0) {
  BELUGA_CHECK(max_k >= 1, "SpecGate needs at least one draft token");
}

SpecGate::Bucket& SpecGate::bucket(int batch) {
  Bucket& b = buckets_[DecodeGraphs::batch_bucket(std::max(1, batch))];
  if (b.by_k.empty()) b.by_k.resize(size_t(max_k_) + 1);
  return b;
}

double SpecGate::prefix_acceptance(int j) const {
  BELUGA_ASSERT(j >= 1 && j <= max_k_);
  double p = 1.0;
  for (int i = 0; i < j; ++i) p *= (passed_[size_t(i)] + kPriorPassed) / (tried_[size_t(i)] + kPriorTried);
  return p;
}

double SpecGate::expected_tokens(int k) const {
  double e = 1.0;
  for (int j = 1; j <= k; ++j) e += prefix_acceptance(j);
  return e;
}

double SpecGate::cost(int batch, int k) const {
  auto it = buckets_.find(DecodeGraphs::batch_bucket(std::max(1, batch)));
  if (it == buckets_.end()) return -1;
  const Cost& c = it->second.by_k[size_t(k)];
  return c.samples >= kMinSamples ? c.seconds : -1;
}

int SpecGate::choose(int batch) {
  if (fixed_) return max_k_;
  Bucket& b = bucket(batch);
  if (++b.decisions % kReprobe == 0)  // measure the other shapes again, starting from their averages
    for (Cost& c : b.by_k) c.samples = std::min(c.samples, kMinSamples - 1);
  // Shapes still being measured first, the deepest first (speculation gets its chance at once).
  for (int k = max_k_; k >= 0; --k)
    if (b.by_k[size_t(k)].samples < kMinSamples) return k;
  int best = 0;
  double best_rate = 0;
  for (int k = 0; k <= max_k_; ++k) {
    const double rate = expected_tokens(k) / b.by_k[size_t(k)].seconds;
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

void SpecGate::observe_cost(int batch, int k, double seconds) {
  if (fixed_ || k < 0 || k > max_k_ || !(seconds > 0)) return;
  Cost& c = bucket(batch).by_k[size_t(k)];
  if (c.skipped < kSkipSamples) {
    c.skipped++;
    return;
  }
  if (c.total < kMinSamples) {  // the first samples: their minimum (graph recordings stall some)
    c.seconds = c.total == 0 ? seconds : std::min(c.seconds, seconds);
  } else {
    if (seconds > kOutlier * c.seconds) return;
    c.seconds += kCostWeight * (seconds - c.seconds);
  }
  c.samples++;
  c.total++;
}

void SpecGate::observe_acceptance(int verified, int accepted) {
  verified = std::min(verified, max_k_);
  for (int j = 0; j < verified; ++j) {
    tried_[size_t(j)] *= kDecay;
    passed_[size_t(j)] *= kDecay;
    tried_[size_t(j)] += 1;
    if (j < accepted) passed_[size_t(j)] += 1;
    if (j >= accepted) break;  // later positions were not reached
  }
}

}  // namespace beluga
