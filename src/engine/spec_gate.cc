#include "engine/spec_gate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "model/decode_graphs.h"
#include "util/error.h"
#include "util/log.h"

namespace beluga {

namespace {

constexpr double kCostWeight = 0.2;  // of a new period in the moving average
constexpr double kDecay = 0.995;     // of a position's acceptance counts per observation
constexpr double kOutlier = 4.0;     // periods this many times the average are dropped (stalls)
constexpr double kPrior = 2.0;       // prior pseudo-counts of a bin, at its centre (no score: 1/2)
// Drafting must beat plain decode (and verifying must beat drafting alone) by this factor: near
// break-even measurement noise would flip the choice, and each switch costs what the rates miss.
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
  b.size = std::max(1, batch);
  if (b.by_k.empty()) {
    b.by_k.resize(size_t(max_k_) + 1);
    b.chose.resize(size_t(max_k_) + 1);
  }
  return b;
}

const SpecGate::Bucket* SpecGate::find(int batch) const {
  auto it = buckets_.find(DecodeGraphs::batch_bucket(std::max(1, batch)));
  return it == buckets_.end() ? nullptr : &it->second;
}

void SpecGate::log_bucket(int bucket, const Bucket& b) const {
  if (!log::enabled(log::Level::kDebug)) return;
  auto fmt = [](double v) {
    char x[32];
    std::snprintf(x, sizeof x, "%.3f", v);
    return std::string(x);
  };
  auto tps = [&](const Rate& r) { return r.seconds > 0 ? fmt(r.tokens / r.seconds) : std::string("-"); };
  std::string line = str("spec gate: batch bucket ", bucket, ", ", b.decisions, " decisions: tokens/s plain ",
                         tps(b.rate[0]), " (", b.rate[0].steps, " steps) drafting ", tps(b.rate[1]), " (",
                         b.rate[1].steps, " steps); chose plain ", b.plain);
  for (int k = 0; k <= max_k_; ++k) {
    const Cost& c = b.by_k[size_t(k)];
    line += str(", depth ", k, " ", b.chose[size_t(k)], " (", fmt(c.seconds * 1e3), " ms, ", c.samples,
                " samples)");
  }
  for (int j = 0; j < max_k_; ++j) line += str("; acceptance ", j, " ", fmt(mean_acceptance(j, false)));
  log::debug("engine", line);
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
  const Bucket* b = find(batch);
  if (!b) return -1;
  const Cost& c = b->by_k[size_t(k)];
  return c.samples >= kMinSamples ? c.seconds : -1;
}

double SpecGate::rate(int batch, bool drafting) const {
  const Bucket* b = find(batch);
  if (!b) return -1;
  const Rate& r = b->rate[drafting ? 1 : 0];
  return r.steps >= kMinSamples && r.seconds > 0 ? r.tokens / r.seconds : -1;
}

double SpecGate::step_cost(const Bucket& b, double x) const {
  x = std::clamp(x, 0.0, double(max_k_));
  const int lo = int(std::floor(x)), hi = std::min(max_k_, lo + 1);
  const double w = x - lo;
  return (1 - w) * b.by_k[size_t(lo)].seconds + w * b.by_k[size_t(hi)].seconds;
}

bool SpecGate::regime(Bucket& b, int64_t d) {
  if (d < kProbe) return b.probe_on;
  if (d < 2 * kProbe) return !b.probe_on;
  if (d == 2 * kProbe) {
    // The probes' measured tokens per second; too few steady steps in either (a busy server's steps
    // carry prompts): keep the regime in force.
    const Rate &off = b.rate[0], &on = b.rate[1];
    if (off.steps >= kMinSamples && on.steps >= kMinSamples && off.seconds > 0 && on.seconds > 0)
      b.on = on.tokens / on.seconds > kMinGain * (off.tokens / off.seconds);
    log::debug("engine", "spec gate: batch bucket ", DecodeGraphs::batch_bucket(b.size), ": probes ",
               on.steps, " drafting steps, ", on.tokens, " tokens in ", on.seconds * 1e3, " ms; ", off.steps,
               " plain steps, ", off.tokens, " tokens in ", off.seconds * 1e3,
               " ms: ", b.on ? "drafting" : "plain");
  }
  return b.on;
}

int SpecGate::plan(int batch, const std::vector<DraftScores>& seqs, std::vector<int>& admit) {
  admit.assign(seqs.size(), 0);
  if (mode_ == Mode::kFixed) {
    for (size_t i = 0; i < seqs.size(); ++i) admit[i] = std::min(seqs[i].num_drafts, max_k_);
    last_drafting_ = true;
    return last_depth_ = max_k_;
  }
  // No decode to plan (prompt chunks only): keep the regime of the last decode step, so that while
  // drafting a prompt still gets its MTP pass (its MTP KV and first drafts).
  if (seqs.empty()) return last_depth_;
  batch = std::max(1, batch);
  Bucket& b = bucket(batch);
  const int64_t d = b.decisions % kCycle;
  if (d == 0 && b.decisions > 0) {  // a new cycle: every rate and cost measured again, from scratch
    log_bucket(DecodeGraphs::batch_bucket(batch), b);
    for (Cost& c : b.by_k) c = Cost{};
    b.rate[0] = b.rate[1] = Rate{};
    std::fill(b.chose.begin(), b.chose.end(), 0);
    b.plain = 0;
    b.probe_on = b.on;  // probe the regime in force first: one switch less when it stays
  }
  b.decisions++;
  last_drafting_ = regime(b, d);
  if (!last_drafting_) {
    b.plain++;
    return last_depth_ = 0;
  }
  const int k = depth(b, batch, seqs, admit);
  b.chose[size_t(k)]++;
  return last_depth_ = k;
}

int SpecGate::depth(Bucket& b, int batch, const std::vector<DraftScores>& seqs, std::vector<int>& admit) {
  auto uniform = [&](int k) {
    for (size_t i = 0; i < seqs.size(); ++i) admit[i] = std::min(seqs[i].num_drafts, k);
    return k;
  };
  // Depths still being measured first, the deepest first (speculation gets its chance at once).
  for (int k = max_k_; k >= 0; --k)
    if (b.by_k[size_t(k)].samples < kMinSamples) return uniform(k);

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
  double best = kMinGain * double(batch) / b.by_k[0].seconds;  // the MTP pass alone, nothing verified
  int depth = 0;
  if (padded_) {
    // Every sequence computes the deepest one's rows: compare the depths, each verifying all it can.
    std::vector<double> gain(size_t(max_k_) + 1, 0.0);
    for (const Candidate& c : cand_) gain[size_t(c.depth)] += c.survival;
    double e = batch;
    for (int k = 1; k <= max_k_; ++k) {
      e += gain[size_t(k)];
      const double r = e / b.by_k[size_t(k)].seconds;
      if (r > best) {
        best = r;
        depth = k;
      }
    }
    return uniform(depth);
  }
  // Ragged rows: admit in order of survival (a sequence's drafts come in order: survival only falls
  // along it) while expected tokens per second rise; the best prefix wins.
  std::sort(cand_.begin(), cand_.end(), [](const Candidate& a, const Candidate& c) {
    if (a.survival != c.survival) return a.survival > c.survival;
    if (a.depth != c.depth) return a.depth < c.depth;
    return a.seq < c.seq;
  });
  size_t admitted = 0;
  double e = batch;
  for (size_t n = 1; n <= cand_.size(); ++n) {
    e += cand_[n - 1].survival;
    const double r = e / step_cost(b, double(n) / batch);
    if (r > best) {
      best = r;
      admitted = n;
    }
  }
  for (size_t n = 0; n < admitted; ++n) {
    const Candidate& c = cand_[n];
    depth = std::max(depth, c.depth);
    if (c.depth <= seqs[size_t(c.seq)].num_drafts)
      admit[size_t(c.seq)] = std::max(admit[size_t(c.seq)], c.depth);
  }
  return depth;
}

void SpecGate::observe_step(int batch, bool drafting, int k, int tokens, double seconds) {
  if (mode_ == Mode::kFixed || !(seconds > 0) || tokens <= 0) return;
  Bucket& b = bucket(batch);
  Rate& r = b.rate[drafting ? 1 : 0];
  // The first steady steps of a regime in a cycle are its switching transient (a drafting step after
  // plain ones only proposes; graphs are recorded): dropped, like stalls. The drafting probe includes
  // the depths' exploration: a cost of drafting, paid each cycle.
  if (r.skipped < kSkipSamples) {
    r.skipped++;
  } else if (r.steps < kMinSamples || seconds <= kOutlier * r.seconds / r.steps) {
    r.tokens += tokens;
    r.seconds += seconds;
    r.steps++;
  }
  if (!drafting || k < 0 || k > max_k_) return;
  Cost& c = b.by_k[size_t(k)];
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
