#include "engine/spec_gate.h"

#include <algorithm>
#include <cmath>

#include "model/decode_graphs.h"
#include "util/error.h"

namespace beluga {

namespace {

constexpr double kCostWeight = 0.2;  // of a new period in the moving average
constexpr double kDecay = 0.995;     // of a position's acceptance counts per observation
constexpr double kOutlier = 4.0;     // periods this many times the average are dropped (stalls)
constexpr double kPrior = 2.0;       // prior pseudo-counts of a bin, at its centre (no score: 1/2)
// Speculating must beat plain decode by this factor: switching costs what the steady rates miss (the
// first speculating step only proposes; speculating steps do not overlap; MTP KV of positions
// decoded plainly is stale), and near break-even measurement noise would flip the choice.
constexpr double kMinGain = 1.05;

}  // namespace

SpecGate::SpecGate(int max_k, Mode mode, bool padded)
    : max_k_(max_k),
      mode_(mode),
      padded_(padded),
      counts_(size_t(2 * max_k * (kBins + 1))),
      last_depth_(max_k) {
  BELUGA_CHECK(max_k >= 1, "SpecGate needs at least one draft token");
}

SpecGate::Bucket& SpecGate::bucket(int batch) {
  Bucket& b = buckets_[DecodeGraphs::batch_bucket(std::max(1, batch))];
  if (b.by_k.empty()) b.by_k.resize(size_t(max_k_) + 1);
  return b;
}

double SpecGate::acceptance(int j, float q, bool sampled) const {
  BELUGA_ASSERT(j >= 0 && j < max_k_);
  const int b = bin(q);
  const double centre = b == kBins ? 0.5 : (b + 0.5) / kBins;
  const Counts& c = counts(sampled, j, b);
  return (c.passed + kPrior * centre) / (c.tried + kPrior);
}

double SpecGate::mean_acceptance(int j, bool sampled) const {
  BELUGA_ASSERT(j >= 0 && j < max_k_);
  double tried = 0, passed = 0;
  for (int b = 0; b <= kBins; ++b) {
    tried += counts(sampled, j, b).tried;
    passed += counts(sampled, j, b).passed;
  }
  return (passed + 0.5 * kPrior) / (tried + kPrior);
}

double SpecGate::cost(int batch, int k) const {
  auto it = buckets_.find(DecodeGraphs::batch_bucket(std::max(1, batch)));
  if (it == buckets_.end()) return -1;
  const Cost& c = it->second.by_k[size_t(k)];
  return c.samples >= kMinSamples ? c.seconds : -1;
}

double SpecGate::step_cost(const Bucket& b, double x) const {
  x = std::clamp(x, 0.0, double(max_k_));
  const int lo = int(std::floor(x)), hi = std::min(max_k_, lo + 1);
  const double w = x - lo;
  return (1 - w) * b.by_k[size_t(lo)].seconds + w * b.by_k[size_t(hi)].seconds;
}

int SpecGate::plan(int batch, const std::vector<DraftScores>& seqs, std::vector<int>& admit) {
  admit.assign(seqs.size(), 0);
  auto uniform = [&](int k) {
    for (size_t i = 0; i < seqs.size(); ++i) admit[i] = std::min(seqs[i].num_drafts, k);
    return k;
  };
  if (mode_ == Mode::kFixed) return uniform(max_k_);
  // No decode to plan (prompt chunks only): keep the regime of the last decode step, so that while
  // speculation pays a prompt still gets its MTP pass (its MTP KV and first drafts).
  if (seqs.empty()) return last_depth_;
  batch = std::max(1, batch);
  Bucket& b = bucket(batch);
  // Measure every shape again, from scratch: a shape not chosen for kReprobe decisions keeps the cost
  // it had then (often the first, cold steps': graph recordings, short contexts), and folding one new
  // sample into that average corrected it too slowly (H200 run 275: the gate kept plain decode at
  // batch 64 where fixed K=1 ran 14 % faster).
  if (++b.decisions % kReprobe == 0)
    for (Cost& c : b.by_k) c = Cost{};
  // Shapes still being measured first, the deepest first (speculation gets its chance at once).
  for (int k = max_k_; k >= 0; --k)
    if (b.by_k[size_t(k)].samples < kMinSamples) return last_depth_ = uniform(k);

  // Every eligible sequence's K candidate drafts and their survivals.
  cand_.clear();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const DraftScores& d = seqs[i];
    double survival = 1;
    for (int j = 0; j < max_k_; ++j) {
      const bool scored = mode_ == Mode::kConfidence && j < d.num_drafts;
      survival *= scored ? acceptance(j, d.q ? d.q[j] : -1.0f, d.sampled) : mean_acceptance(j, d.sampled);
      cand_.push_back({survival, int(i), j + 1});
    }
  }
  const double plain = double(batch) / b.by_k[0].seconds;
  int depth = 0;
  size_t admitted = 0;
  double best = kMinGain * plain;
  if (padded_) {
    // Every sequence computes the deepest one's rows: compare the depths, each verifying all it can.
    std::vector<double> gain(size_t(max_k_) + 1, 0.0);
    for (const Candidate& c : cand_) gain[size_t(c.depth)] += c.survival;
    double e = batch;
    for (int k = 1; k <= max_k_; ++k) {
      e += gain[size_t(k)];
      const double rate = e / b.by_k[size_t(k)].seconds;
      if (rate > best) {
        best = rate;
        depth = k;
      }
    }
    return last_depth_ = uniform(depth);
  }
  // Ragged rows: admit in order of survival (a sequence's drafts come in order: survival only falls
  // along it) while expected tokens per second rise; the best prefix wins.
  std::sort(cand_.begin(), cand_.end(), [](const Candidate& a, const Candidate& c) {
    if (a.survival != c.survival) return a.survival > c.survival;
    if (a.depth != c.depth) return a.depth < c.depth;
    return a.seq < c.seq;
  });
  double e = batch;
  for (size_t n = 1; n <= cand_.size(); ++n) {
    e += cand_[n - 1].survival;
    const double rate = e / step_cost(b, double(n) / batch);
    if (rate > best) {
      best = rate;
      admitted = n;
    }
  }
  for (size_t n = 0; n < admitted; ++n) {
    const Candidate& c = cand_[n];
    depth = std::max(depth, c.depth);
    if (c.depth <= seqs[size_t(c.seq)].num_drafts)
      admit[size_t(c.seq)] = std::max(admit[size_t(c.seq)], c.depth);
  }
  return last_depth_ = depth;
}

void SpecGate::observe_cost(int batch, int k, double seconds) {
  if (mode_ == Mode::kFixed || k < 0 || k > max_k_ || !(seconds > 0)) return;
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

void SpecGate::observe_acceptance(int verified, int accepted, const float* q, bool sampled) {
  verified = std::min(verified, max_k_);
  for (int j = 0; j < verified; ++j) {
    for (int b = 0; b <= kBins; ++b) {
      Counts& c = counts(sampled, j, b);
      c.tried *= kDecay;
      c.passed *= kDecay;
    }
    Counts& c = counts(sampled, j, bin(q ? q[j] : -1.0f));
    c.tried += 1;
    if (j < accepted) c.passed += 1;
    if (j >= accepted) break;  // later positions were not reached
  }
}

}  // namespace beluga
