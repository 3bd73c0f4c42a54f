// SpecGate: which draft tokens a decode step verifies (DESIGN.md §3: the proposer's confidence and the
// verifier's profiled cost). Single-threaded: the engine thread owns it.
//
// Confidence: draft j (0-based) of a sequence carries a raw score q, the MTP head's softmax probability
// of its own token (none, q < 0, for prompt lookup). Calibrated online: P(draft j accepted | drafts
// before it accepted) is counted per (greedy or sampled, position j, q in one of kBins equal bins) with
// decayed counts and a prior at the bin's centre (no score: a prior of 1/2 in a bin of its own). A
// draft's survival is the product of the calibrated acceptances of it and the drafts before it.
//
// Cost: cost(B, x), the measured period of steady decode steps at B's batch bucket
// (DecodeGraphs::batch_bucket) verifying x drafts per sequence, at x = 0 (plain decode: no verify
// rows, no MTP pass) and each uniform depth 1..K; linear in between.
//
// Admission ("confidence"): the step's candidate drafts in order of survival (a sequence's own drafts
// in order), and the engine verifies the prefix that maximises expected tokens per second,
//   (B + sum of admitted survivals) / cost(B, x),   x = admitted drafts / B,
// provided it beats plain decode (B / cost(B, 0)) by 5 % (switching has costs the rates miss);
// with `padded` (the backend replays uniform shapes, so every sequence computes the deepest one's rows)
// x is the deepest admitted depth instead, and every draft up to that depth is verified (free).
// Drafts a sequence does not hold yet (its first speculating step, or after plain steps) count at
// their position's mean survival: the plan is for the steady state, and verifying them means running
// the MTP pass that proposes them. "cost" is the same rule with every draft at its position's mean
// (one depth for the batch); "fixed" always verifies K. A shape with too few cost samples is tried
// first (deepest first), and every kReprobe decisions at a bucket all shapes are measured again from
// scratch (their old costs dropped).
#pragma once

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

  static constexpr int kMinSamples = 3;   // measured periods before a shape's cost is trusted
  static constexpr int kSkipSamples = 1;  // first periods of a shape dropped (graph recording)
  static constexpr int kReprobe = 512;    // decisions at a bucket between re-measurements
  static constexpr int kBins = 10;        // score bins of the calibration

  // The plan of a step of `batch` sequences whose eligible decodes are `seqs`: admit[i] = drafts of
  // seqs[i] to verify (<= its num_drafts), and the return value the step's depth: 0 plain decode (no
  // MTP pass), else the most drafts any sequence may verify (with `padded`, what each computes). A
  // step without decodes (prompt chunks only) gets the last decode step's depth.
  int plan(int batch, const std::vector<DraftScores>& seqs, std::vector<int>& admit);
  // A steady decode step of `batch` sequences verifying `k` drafts each (k = 0: plain, no MTP pass)
  // took `seconds` from the previous step's results to its own.
  void observe_cost(int batch, int k, double seconds);
  // One sequence-step verified `verified` drafts (scores q, or null) and accepted the first `accepted`.
  void observe_acceptance(int verified, int accepted, const float* q, bool sampled);

  // Calibrated P(draft at position j accepted | the ones before accepted), for score q (< 0: none).
  double acceptance(int j, float q, bool sampled) const;
  // The position's mean over its bins, weighted by how often each was seen.
  double mean_acceptance(int j, bool sampled) const;
  // The measured cost of a shape, or < 0 while it has fewer than kMinSamples samples.
  double cost(int batch, int k) const;
  int max_k() const { return max_k_; }
  bool padded() const { return padded_; }

 private:
  struct Cost {
    double seconds = 0;  // exponential moving average
    int samples = 0;     // trusted samples since the last reprobe
    int skipped = 0;     // first samples dropped
    int total = 0;       // trusted samples ever
  };
  struct Bucket {
    std::vector<Cost> by_k;  // [0..K]
    int64_t decisions = 0;
  };
  struct Counts {
    double tried = 0, passed = 0;
  };
  struct Candidate {
    double survival;
    int seq, depth;  // depth 1-based
  };
  Bucket& bucket(int batch);
  static int bin(float q) { return q < 0 ? kBins : q >= 1 ? kBins - 1 : int(q * kBins); }
  const Counts& counts(bool sampled, int j, int b) const {
    return counts_[(size_t(sampled) * size_t(max_k_) + size_t(j)) * (kBins + 1) + size_t(b)];
  }
  Counts& counts(bool sampled, int j, int b) {
    return counts_[(size_t(sampled) * size_t(max_k_) + size_t(j)) * (kBins + 1) + size_t(b)];
  }
  double step_cost(const Bucket& b, double x) const;

  int max_k_;
  Mode mode_;
  bool padded_;
  std::map<int, Bucket> buckets_;  // batch bucket -> costs
  std::vector<Counts> counts_;     // [sampled][position][bin 0..kBins] (kBins: no score)
  std::vector<Candidate> cand_;    // plan()'s scratch
  int last_depth_;                 // the last decode step's depth (a step without decodes keeps it)
};

}  // namespace beluga
