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
// Verifying must beat drafting alone by this factor: near break-even measurement noise would flip it.
constexpr double kMinGain = 1.05;
// Drafting must beat plain decode by this factor in the probes' steady steps: their comparison leaves
// out the MTP pass that drafting adds to every prompt step (this machine's CPU, demo model, 64-token
// outputs at concurrency 16: steady drafting steps 6 % faster, the server 0.78x), and each switch.
constexpr double kRegimeGain = 1.10;

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

int SpecGate::band_of(int batch) {
  int b = 1;
  while (b < batch) b *= 4;
  return b;
}

namespace {
std::string fixed3(double v) {
  char x[32];
  std::snprintf(x, sizeof x, "%.3f", v);
  return x;
}
}  // namespace

void SpecGate::log_band(int band, const Band& r) const {
  if (!log::enabled(log::Level::kDebug)) return;
  auto tps = [&](const Rate& x) { return x.seconds > 0 ? fixed3(x.tokens / x.seconds) : std::string("-"); };
  log::debug("engine", "spec gate: batch band ", band, ", ", r.decisions, " decisions: tokens/s plain ",
             tps(r.rate[0]), " (", r.rate[0].steps, " steps) drafting ", tps(r.rate[1]), " (",
             r.rate[1].steps, " steps); chose plain ", r.plain);
}

void SpecGate::log_bucket(int bucket, const Bucket& b) const {
  if (!log::enabled(log::Level::kDebug)) return;
  std::string line = str("spec gate: batch bucket ", bucket, ", ", b.decisions, " decisions:");
  for (int k = 0; k <= max_k_; ++k) {
    const Cost& c = b.by_k[size_t(k)];
    const double n = std::max(1, c.samples);
    line +=
        str(" depth ", k, " ", b.chose[size_t(k)], " (",
            paired(band_of(bucket)) ? fixed3(c.seconds) + "x forward" : fixed3(c.seconds * 1e3) + " ms", ", ",
            c.samples, " samples, mean period ", fixed3(c.period_sum / n * 1e6), " us",
            c.forward_sum > 0 ? ", forward " + fixed3(c.forward_sum / n * 1e6) + " us" : std::string(), ")");
  }
  for (int j = 0; j < max_k_; ++j) line += str("; acceptance ", j, " ", fixed3(mean_acceptance(j, false)));
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
  auto it = bands_.find(band_of(std::max(1, batch)));
  if (it == bands_.end()) return -1;
  const Rate& r = it->second.rate[drafting ? 1 : 0];
  return r.steps >= kMinSamples && r.seconds > 0 ? r.tokens / r.seconds : -1;
}

double SpecGate::step_cost(const Bucket& b, double x) const {
  x = std::clamp(x, 0.0, double(max_k_));
  const int lo = int(std::floor(x)), hi = std::min(max_k_, lo + 1);
  const double w = x - lo;
  return (1 - w) * b.by_k[size_t(lo)].seconds + w * b.by_k[size_t(hi)].seconds;
}

SpecGate::Rate SpecGate::plain_rate(const Band& r, int band) const {
  if (!paired(band)) return r.rate[0];
  Rate p = r.paired;
  p.seconds *= r.plain_factor;
  return p;
}

// The probes' verdict: whether drafting wins, and whether the loser was far slower; false when either
// regime has too few steady steps (a busy server's steps carry prompts): the regime in force stays.
bool SpecGate::verdict(const Band& r, int band, bool* on, bool* far) const {
  const Rate off = plain_rate(r, band);
  const Rate& dr = r.rate[1];
  if (off.steps < kMinSamples || dr.steps < kMinSamples || off.seconds <= 0 || dr.seconds <= 0) return false;
  const double on_rate = dr.per_seq(), off_rate = off.per_seq();
  *on = on_rate > kRegimeGain * off_rate;
  *far = std::max(on_rate, off_rate) > kFarSlower * std::min(on_rate, off_rate);
  return true;
}

bool SpecGate::advance(Band& r, int band, bool log) const {
  if (paired(band)) return advance_paired(r, band, log);
  const int64_t d = r.decisions % kCycle;
  if (d == 0 && r.decisions > 0) {  // a new cycle: the rates measured again, from scratch
    if (log) log_band(band, r);
    r.held = r.rate[r.on ? 1 : 0];
    r.rate[0] = r.rate[1] = Rate{};
    r.plain = 0;
    r.probe_on = r.on;  // probe the regime in force first: one switch less when it stays
    r.probing = r.quiet == 0;
    if (r.quiet > 0) r.quiet--;
  }
  r.decisions++;
  bool on = r.on;
  if (r.probing && d < 2 * kProbe) {
    on = d < kProbe ? r.probe_on : !r.probe_on;
  } else if (r.probing && d == 2 * kProbe) {
    bool far = false;
    Band v = r;  // the regime in force: its probe and the last cycle's steps
    v.rate[r.probe_on ? 1 : 0].merge(r.held);
    if (verdict(v, band, &r.on, &far)) {
      r.backoff = far ? std::min(kMaxQuiet, std::max(1, 2 * r.backoff)) : 0;
      r.quiet = r.backoff;
    }
    on = r.on;
    if (log)
      log::debug("engine", "spec gate: batch band ", band, ": probes ", r.rate[1].steps, " drafting steps, ",
                 r.rate[1].tokens, " tokens in ", r.rate[1].seconds * 1e3, " ms (", r.rate[1].seqs,
                 " sequence-steps); ", r.rate[0].steps, " plain steps, ", r.rate[0].tokens, " tokens in ",
                 r.rate[0].seconds * 1e3, " ms (", r.rate[0].seqs, " sequence-steps); ",
                 r.probe_on ? "drafting" : "plain", " the last cycle ", r.held.steps, " steps, ",
                 r.held.tokens, " tokens in ", r.held.seconds * 1e3, " ms: ", on ? "drafting" : "plain");
  }
  if (!on) r.plain++;
  return on;
}

bool SpecGate::advance_paired(Band& r, int band, bool log) const {
  auto start = [&](bool on) {  // a new drafting window or hold, measured from scratch
    r.on = on;
    r.run = 0;
    r.rate[0] = r.rate[1] = r.paired = Rate{};
  };
  // A calibration window: plain decisions until its steps are in (they follow the decisions by a step
  // or two), then the drafting window's verdict below.
  bool calibrated = false;
  if (r.calibrating) {
    const bool measured =
        r.calib_decisions >= kCalibSteps && r.calib_plain.steps + kCalibSkip + 2 >= kCalibSteps;
    if (!measured && r.calib_decisions < 5 * kCalibSteps) {  // else its steps never came: the factor stays
      r.calib_decisions++;
      r.decisions++;
      r.plain++;
      return false;
    }
    if (measured && r.calib_forward > 0) {
      const double plain_step = r.calib_plain.seconds / r.calib_plain.steps;
      r.plain_factor = plain_step / r.calib_forward;
      if (log)
        log::debug("engine", "spec gate: batch band ", band, ": calibration: plain step ", plain_step * 1e6,
                   " us against verify forwards of ", r.calib_forward * 1e6, " us: factor ", r.plain_factor);
    }
    r.calibrating = false;
    calibrated = true;
  }
  if (r.on && r.run >= kPairedWindow && !calibrated && r.windows_to_calib == 0 && r.recent_filled > 0) {
    r.calibrating = true;
    r.calib_decisions = 1;  // this one
    r.calib_seen = 0;
    r.calib_plain = Rate{};
    r.calib_forward = r.recent_forward();
    r.windows_to_calib = kCalibEvery;
    if (log && log::enabled(log::Level::kDebug)) {
      std::string fw;
      for (int i = 0; i < r.recent_filled; ++i) {  // oldest first
        const int j = (r.recent_next - r.recent_filled + i + kRecentForwards) % kRecentForwards;
        fw += str(i ? " " : "", fixed3(r.recent[size_t(j)] * 1e6));
      }
      log::debug("engine", "spec gate: batch band ", band, ": calibration window: last verify forwards [", fw,
                 "] us, median ", r.calib_forward * 1e6, " us");
    }
    r.decisions++;
    r.plain++;
    return false;
  }
  if (r.on && r.run >= kPairedWindow) {  // a drafting window: its verdict (kept open while it has none)
    bool on = true, far = false;
    if (verdict(r, band, &on, &far)) {
      if (r.windows_to_calib > 0) r.windows_to_calib--;
      if (log)
        log::debug("engine", "spec gate: batch band ", band, ": ", r.rate[1].steps, " drafting steps, ",
                   r.rate[1].tokens, " tokens in ", r.rate[1].seconds * 1e3, " ms; plain (their forwards x ",
                   r.plain_factor, ") ", r.paired.tokens, " tokens in ", r.paired.seconds * 1e3,
                   " ms: ", on ? "drafting" : "plain");
      // Each window that loses doubles the next hold (a far slower one, twice); one that wins resets it.
      r.backoff = on ? 0 : std::min(kMaxQuiet, std::max(far ? 2 : 1, (far ? 4 : 2) * r.backoff));
      start(on);
    }
  } else if (!r.on && r.run >= int64_t(kPairedHold) * r.backoff) {  // the hold is over
    start(true);
  }
  r.decisions++;
  r.run++;
  if (!r.on) r.plain++;
  return r.on;
}

bool SpecGate::would_draft(int batch, bool decodes) const {
  if (mode_ == Mode::kFixed) return true;
  if (!decodes) return last_drafting_;
  const int band = band_of(std::max(1, batch));
  const auto it = bands_.find(band);
  Band r = it == bands_.end() ? Band{} : it->second;  // plan()'s decision, on a copy of the band
  return advance(r, band, false);
}

int SpecGate::plan(int batch, const std::vector<DraftScores>& seqs, std::vector<int>& admit) {
  admit.assign(seqs.size(), 0);
  last_explored_ = false;
  if (mode_ == Mode::kFixed) {
    for (size_t i = 0; i < seqs.size(); ++i) admit[i] = std::min(seqs[i].num_drafts, max_k_);
    last_drafting_ = true;
    return last_depth_ = max_k_;
  }
  // No decode to plan (prompt chunks only): keep the regime of the last decode step, so that while
  // drafting a prompt still gets its MTP pass (its MTP KV and first drafts).
  if (seqs.empty()) return last_depth_;
  batch = std::max(1, batch);
  const int band_id = band_of(batch);
  last_drafting_ = advance(bands_[band_id], band_id, true);
  Bucket& b = bucket(batch);
  if (b.decisions % kCycle == 0 && b.decisions > 0) {  // and the depths' costs, at their own pace
    log_bucket(DecodeGraphs::batch_bucket(batch), b);
    for (Cost& c : b.by_k) c = Cost{};
    std::fill(b.chose.begin(), b.chose.end(), 0);
  }
  b.decisions++;
  if (!last_drafting_) return last_depth_ = 0;
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
    if (b.by_k[size_t(k)].samples < kMinSamples) {
      last_explored_ = true;
      return uniform(k);
    }

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

void SpecGate::observe_step(int batch, bool drafting, int k, int tokens, double seconds,
                            double forward_seconds, bool explored) {
  if (mode_ == Mode::kFixed || !(seconds > 0) || tokens <= 0) return;
  Bucket& b = bucket(batch);
  const int band_id = band_of(std::max(1, batch));
  Band& r = bands_[band_id];
  // The first steady steps of a regime in a cycle are its switching transient (a drafting step after
  // plain ones only proposes; graphs are recorded): dropped, like stalls. Exploring steps measure a
  // depth, not the regime (they would fill half a drafting probe and are a few steps of its cycle).
  if (!(drafting && explored)) r.rate[drafting ? 1 : 0].add(tokens, seconds, batch);
  const bool paired_step = drafting && forward_seconds > 0 && paired(band_id);
  if (paired_step) {
    r.paired.add(batch, forward_seconds, batch);  // the same steps' forwards: plain's estimate
    r.recent[size_t(r.recent_next)] = forward_seconds;
    r.recent_next = (r.recent_next + 1) % kRecentForwards;
    r.recent_filled = std::min(r.recent_filled + 1, kRecentForwards);
  }
  if (!drafting && paired(band_id) && r.calibrating && ++r.calib_seen > kCalibSkip)
    r.calib_plain.add(tokens, seconds, batch);
  if (!drafting || k < 0 || k > max_k_) return;
  // At low load a depth's cost is relative: the step's period over its own verify forward (a plain
  // step at these lengths), so depths measured at different positions of a request compare.
  const double period = seconds;
  if (paired_step) seconds /= forward_seconds;
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
  c.period_sum += period;
  if (paired_step) c.forward_sum += forward_seconds;
}

double SpecGate::Band::recent_forward() const {
  const int n = recent_filled;
  if (n == 0) return 0;
  std::array<double, kRecentForwards> v = recent;
  std::nth_element(v.begin(), v.begin() + n / 2, v.begin() + n);
  return v[size_t(n / 2)];
}

void SpecGate::Rate::add(double step_tokens, double step_seconds, int batch) {
  if (skipped < kSkipSamples) {
    skipped++;
  } else if (steps < kMinSamples || step_seconds <= kOutlier * seconds / steps) {
    tokens += step_tokens;
    seconds += step_seconds;
    seqs += batch;
    steps++;
  }
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
