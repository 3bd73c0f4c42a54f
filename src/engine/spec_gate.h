// SpecGate: which draft tokens a decode step verifies (DESIGN.md §3: the proposer's confidence and the
// verifier's profiled cost). Single-threaded: the engine thread owns it. Two levels:
//
// Regime, per load band (the batch up to 1, 4, 16, 64, 256, ...: a batch that crosses a bucket edge
// under load keeps its regime): drafting on (every eligible decode runs the MTP pass, so its drafts
// and its MTP KV stay current, whatever is verified) or off (plain decode: no MTP pass, no verify rows;
// steps overlap). Chosen by measured tokens per second, not by a model: each cycle of kCycle decisions starts
// with kProbe decisions in the regime in force, then kProbe in the other, then runs the faster one (drafting
// must win by 10 %: the steady steps leave out the MTP pass it adds to prompt steps) until the next cycle.
// The regimes compare tokens per second a sequence (over the mean batch of the steps each measured),
// not per step: a decode step's cost hardly depends on its batch within a band, and a probe whose
// window held prompts (steps of fewer decodes) read that much slower (H100 run 338: the plain probe's
// steps held 11.2 sequences, the drafting ones 16, so drafting ran a whole cycle at band 16 where
// plain decode was faster).
// The drafting regime's rate leaves out the steps that explore a depth's cost (every depth, a few steps
// each, from scratch each cycle: half of a K=3 probe, where they made drafting read 0.8-1.0x plain at
// batch 16 when drafting at the chosen depth ran 1.3x; H100 run 332); over a cycle they are ~2 % of its
// steps. The regime in force is measured by its probe and the last cycle's steady steps together (hundreds of
// steps, where a 32-step window in a closed loop read 0.7-1.2x of the regime's sustained rate: H100
// run 316, sampled K=1 at c16 drafting all run at 0.86x after probes that said 1.11x and 1.23x).
// At low load on a backend that replays graphs (band 1: batch <= kPairedMaxBatch, `padded`) the plain
// regime is not probed over time but estimated inside the drafting steps themselves, paired: one token
// over the step's verify forward (a plain step is that forward with one row, about as costly at batch
// 1, where launches bound it, and its host work overlaps; H100 run 311: the estimate 5-8 % under the
// plain server's steps at batch 1, but 15 % at batch 4 sampled, where it drafted at 0.88x; after the
// attention change of run 318 a K=3 verify forward is 387 us against 332, 14 % under). A step's cost drifts
// with its sequences' lengths (at batch 1 on the GPU the demo model's step grows from ~0.34 to ~0.78 ms over
// a 320-token request) and a band-1 workload restarts it at each request, so two windows one after the other
// compared the regimes at different lengths and ran plain for whole cycles where drafting was 1.3-1.6x (H100
// runs 306-307; interleaving the windows left holes in the MTP KV and measured worse). Since drafting
// measures both regimes at no cost, such a band has no cycle: while drafting, every kPairedWindow decisions
// give a verdict on that window alone (one request's stretch of unlikely drafts turns drafting off for a
// hold, not for the next requests: H100 run 309 chose plain for a whole cycle from a 31-step window);
// plain holds for kPairedHold decisions, doubling (up to kMaxQuiet times) while the windows after it
// keep losing, then drafts a window again. The estimate is calibrated: after a band's first drafting
// window and every kCalibEvery-th, kCalibSteps plain decisions measure a plain step against the verify
// forwards just before them (their median: the cost drifts with length), and plain's estimate is the
// forwards times that ratio. A verify forward of 1 + K rows is no plain step once plain steps are cheap:
// H100 run 349, 305 us against 231, so sampled K=3 drafting read 1.12x where it ran 0.93x.
// A regime that measured 1.3x slower is probed again only every 2, 4, 8 cycles (back to every cycle once it
// is not): on the GPU a drafting probe of sampled rows at batch 64 ran ~7x a plain step when they
// sampled on the host, and 64 probe decisions a cycle cost sampled traffic a fifth of its throughput;
// with K=3 a sampled drafting probe (every depth explored) still runs 1.4-2.7x plain steps at batch 16-64
// (H100 run 315: probed every cycle at 1.36-1.47x, the server 0.92x).
// Switching per step cost more than either regime: a step after plain steps only proposes, speculating steps
// do not overlap, and positions decoded plainly leave holes in the MTP KV that lower acceptance for the rest
// of the sequence (H100 run 280: K=1 switching per step ran 0.84x plain decode where always drafting
// ran 1.20x).
//
// Depth, while drafting. Confidence: draft j (0-based) of a sequence carries a raw score q, the MTP head's
// softmax probability of its own token (none, q < 0, for prompt lookup). Calibrated online: P(draft j
// accepted | drafts before it accepted) is counted per (greedy or sampled, position j, q in one of kBins
// equal bins) with decayed counts and a prior at the bin's centre (no score: a prior of 1/2 in a bin of
// its own). A draft's survival is the product of the calibrated acceptances of it and the drafts before
// it. Cost: cost(B, x), the measured period of steady drafting steps at B's bucket verifying x drafts per
// sequence at each uniform depth 0..K (0: the MTP pass only), per batch bucket (DecodeGraphs::batch_bucket:
// a graph shape); linear in between. At low load (paired bands) in units of the step's own verify
// forward: a depth measured at a request's start (a depth-0 cost kept from the cycle's exploration)
// and one at its end then compare, where absolute periods made depth 0 look cheaper as the request
// grew and chose it for likely drafts. Admission
// ("confidence"): the step's candidate drafts in order of survival (a sequence's own drafts in order),
// and the engine verifies the prefix that maximises expected tokens per second,
//   (B + sum of admitted survivals) / cost(B, x),   x = admitted drafts / B,
// provided it beats depth 0 by 5 %; with `padded` (the backend replays uniform shapes, so every sequence
// computes the deepest one's rows) x is the deepest admitted depth instead, and every draft up to that
// depth is verified (free). Drafts a sequence does not hold yet count at their position's mean
// survival. "cost" is the same rule with every draft at its position's mean (one depth for the batch);
// "fixed" always drafts and verifies K. A depth with too few cost samples is tried first (deepest first);
// each cycle measures every depth again from scratch. With --log-level debug each cycle logs the bucket's
// rates, costs and choices ("spec gate: ...").
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace beluga {

// The drafts one eligible decode sequence holds for this step (num_drafts may be 0).
struct DraftScores {
  int num_drafts = 0;
  const float* q = nullptr;  // [num_drafts] raw scores, or null: none
  bool sampled = false;      // temperature > 0 (accepted with the target's probability, not its argmax)
};

class SpecGate {
 public:
  enum class Mode { kConfidence, kCost, kFixed };
  SpecGate(int max_k, Mode mode, bool padded);

  static constexpr int kMinSamples = 3;      // measured periods before a shape's cost (or a rate) is trusted
  static constexpr int kSkipSamples = 1;     // first periods of a shape (or of a regime) dropped
  static constexpr int kCycle = 1024;        // decisions at a bucket between re-measurements
  static constexpr int kProbe = 32;          // decisions of each regime at the start of a cycle
  static constexpr int kPairedMaxBatch = 1;  // bands up to this batch estimate plain inside drafting steps
  static constexpr int kPairedWindow = 128;  // their drafting decisions per verdict
  static constexpr int kPairedHold = 256;    // their plain decisions after a verdict for plain, at least
  // Paired bands: a calibration window of kCalibSteps plain decisions follows the band's first drafting
  // window and every kCalibEvery-th after it (its first kCalibSkip plain steps are the switch's transient).
  static constexpr int kCalibSteps = 16, kCalibEvery = 8, kCalibSkip = 2;
  // The calibration's reference: the median of the last kRecentForwards verify forwards. A moving mean
  // of about the last 4 (weight 0.25) read 464 and 521 us at the calibrations of H100 run 353, where the
  // windows' forwards averaged ~300 us: plain was estimated at 0.46-0.51x a forward (0.74-0.78 measured
  // in runs 350-352), and confidence K=3 drafted at 1.02-1.04x where fixed K=3 ran 1.39-1.43x.
  static constexpr int kRecentForwards = 9;
  static constexpr double kFarSlower = 1.3;  // a regime this many times slower is probed less often
  static constexpr int kMaxQuiet = 8;        // cycles without probes, at most
  static constexpr int kBins = 10;           // score bins of the calibration

  // The plan of a step of `batch` sequences whose eligible decodes are `seqs`: admit[i] = drafts of
  // seqs[i] to verify (<= its num_drafts), and the return value the step's depth: the most drafts any
  // sequence may verify (with `padded`, what each computes; 0 when not drafting). drafting() tells
  // whether the step runs the MTP pass. A step without decodes (prompt chunks only) keeps the last
  // decode step's regime and depth.
  int plan(int batch, const std::vector<DraftScores>& seqs, std::vector<int>& admit);
  bool drafting() const { return last_drafting_; }
  // Whether the last plan()'s depth was chosen to measure its cost (a depth with too few samples), not
  // by the admission rule.
  bool explored() const { return last_explored_; }
  // What drafting() will say after the next plan() of a step of `batch` sequences with (`decodes`)
  // or without eligible decodes, if nothing is observed in between: the engine launches a step early
  // only when it will not draft (SpecDecoder::plain_next).
  bool would_draft(int batch, bool decodes) const;
  // A steady decode step of `batch` sequences (every one a decode) took `seconds` from the previous
  // step's results to its own and emitted `tokens`: drafting (verifying `k` drafts each, 0..K) or not.
  // `forward_seconds` (drafting steps; 0: not measured): its verify forward alone, the paired
  // estimate of a plain step at low load. `explored`: the step's depth was explored (explored() of its
  // plan): its cost counts for the depth, not for the drafting regime's rate.
  void observe_step(int batch, bool drafting, int k, int tokens, double seconds, double forward_seconds = 0,
                    bool explored = false);
  // One sequence-step verified `verified` drafts (scores q, or null) and accepted the first `accepted`.
  void observe_acceptance(int verified, int accepted, const float* q, bool sampled);

  // Calibrated P(draft at position j accepted | the ones before accepted), for score q (< 0: none).
  double acceptance(int j, float q, bool sampled) const;
  // The position's mean over its bins, weighted by how often each was seen.
  double mean_acceptance(int j, bool sampled) const;
  // The measured cost of a drafting step verifying k drafts, or < 0 while it has too few samples
  // (at batch <= kPairedMaxBatch relative to its verify forward, when the steps gave one).
  double cost(int batch, int k) const;
  // Measured tokens per second of steady steps in a regime this cycle at the batch's band, or < 0
  // while too few.
  double rate(int batch, bool drafting) const;
  int max_k() const { return max_k_; }
  bool padded() const { return padded_; }

 private:
  struct Cost {
    double seconds = 0;  // exponential moving average
    int samples = 0;     // trusted samples this cycle
    int skipped = 0;     // first samples dropped
    int total = 0;       // trusted samples ever
    // This cycle's trusted samples: their periods and (paired) verify forwards, for the debug log.
    double period_sum = 0, forward_sum = 0;
  };
  struct Rate {
    double tokens = 0, seconds = 0;
    double seqs = 0;  // sequences over the steps counted (their mean batch: seqs / steps)
    int steps = 0, skipped = 0;
    // One step's sample of `batch` sequences: the first kSkipSamples dropped (a switch's transient),
    // then stalls (kOutlier times the mean) once kMinSamples are in.
    void add(double step_tokens, double step_seconds, int batch);
    void merge(const Rate& o) {
      tokens += o.tokens;
      seconds += o.seconds;
      seqs += o.seqs;
      steps += o.steps;
    }
    // Tokens per second a sequence: what the regimes compare, so that one measured over steps that
    // held fewer sequences (prompts in its window) is not charged for them.
    double per_seq() const { return tokens * steps / (seconds * seqs); }
  };
  // The depths' costs and choices, per batch bucket (a graph shape).
  struct Bucket {
    std::vector<Cost> by_k;      // [0..K]
    std::vector<int64_t> chose;  // [0..K]: depths chosen this cycle, drafting
    int64_t decisions = 0;
  };
  // The regime, per load band (batch up to 1, 4, 16, 64, 256, ...): coarser than the buckets, so a
  // batch that moves across a bucket edge under load (48 / 64) keeps one regime.
  struct Band {
    int64_t decisions = 0;
    int64_t plain = 0;     // decisions this cycle not drafting
    bool on = true;        // the regime the last cycle chose (the first one starts drafting)
    bool probe_on = true;  // this cycle's first probe
    Rate rate[2];          // [plain, drafting] this cycle
    Rate paired;           // plain estimated inside this cycle's drafting steps (paired bands)
    Rate held;             // the last cycle's steps of the regime in force at this cycle's start
    // A regime measured far slower (kFarSlower) is probed again only after `quiet` more cycles,
    // doubling up to kMaxQuiet while it stays far slower: its probes cost more than they can find.
    int quiet = 0, backoff = 0;
    bool probing = true;  // this cycle probes
    int64_t run = 0;      // paired bands: decisions in the current window (drafting) or hold (plain)
    // Paired bands: a plain step costs `plain_factor` times the drafting steps' verify forwards, as a
    // calibration window measured it (plain steps against the forwards of the drafting steps just
    // before them, their median: a step's cost drifts with the sequence's length).
    double plain_factor = 1.0;
    std::array<double, kRecentForwards> recent{};  // the last forwards, a ring
    int recent_next = 0, recent_filled = 0;        // the ring's next slot; slots holding a forward
    double recent_forward() const;                 // their median (0: none yet)
    // A calibration window: `calib_decisions` plain decisions so far (kCalibSteps, more while its
    // steps come in), `calib_seen` plain steps observed, those past the transient in `calib_plain`.
    bool calibrating = false;
    int calib_decisions = 0, calib_seen = 0;
    double calib_forward = 0;  // recent_forward() when it began
    Rate calib_plain;
    int windows_to_calib = 0;  // drafting windows judged before the next calibration
  };
  struct Counts {
    double tried = 0, passed = 0;
  };
  struct Candidate {
    double survival;
    int seq, depth;  // depth 1-based
  };
  Bucket& bucket(int batch);
  const Bucket* find(int batch) const;
  static int band_of(int batch);
  static int bin(float q) { return q < 0 ? kBins : q >= 1 ? kBins - 1 : int(q * kBins); }
  const Counts& counts(bool sampled, int j, int b) const {
    return counts_[(size_t(sampled) * size_t(max_k_) + size_t(j)) * (kBins + 1) + size_t(b)];
  }
  Counts& counts(bool sampled, int j, int b) {
    return counts_[(size_t(sampled) * size_t(max_k_) + size_t(j)) * (kBins + 1) + size_t(b)];
  }
  double step_cost(const Bucket& b, double x) const;
  // One decision of a band: whether it drafts. Advances the band's cycle (or, paired, its window or
  // hold) and takes the probes' verdicts; would_draft() runs it on a copy, with `log` off.
  bool advance(Band& r, int band, bool log) const;
  bool advance_paired(Band& r, int band, bool log) const;
  bool verdict(const Band& r, int band, bool* on, bool* far) const;
  // Paired only where graphs replay (launch-bound at batch 1: a verify forward costs about a plain
  // one); on an eager backend (the CPU) rows cost compute, and the verify forward of 4 rows ran 1.5x a
  // plain step (the estimate drafted K=3 at 0.82x plain).
  bool paired(int band) const { return padded_ && band <= kPairedMaxBatch; }
  // The plain side of a band's comparison: its probe's steps, or (paired) the drafting steps' forwards
  // times the calibrated plain factor.
  Rate plain_rate(const Band& r, int band) const;
  // The depth while drafting (the admission rule above).
  int depth(Bucket& b, int batch, const std::vector<DraftScores>& seqs, std::vector<int>& admit);
  // A band's rates and a bucket's costs and choices this cycle, as debug log lines.
  void log_band(int band, const Band& r) const;
  void log_bucket(int bucket, const Bucket& b) const;

  int max_k_;
  Mode mode_;
  bool padded_;
  std::map<int, Bucket> buckets_;  // batch bucket -> costs
  std::map<int, Band> bands_;      // load band -> regime
  std::vector<Counts> counts_;     // [sampled][position][bin 0..kBins] (kBins: no score)
  std::vector<Candidate> cand_;    // plan()'s scratch
  int last_depth_;                 // the last decode step's depth (a step without decodes keeps it)
  bool last_drafting_ = true;      // and whether it drafted
  bool last_explored_ = false;     // and whether its depth was exploration
};

}  // namespace beluga
