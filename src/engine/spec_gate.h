// SpecGate: how many draft tokens a decode step verifies, from measured acceptance and measured step
// cost (DESIGN.md §3: the proposer's confidence and the verifier's profiled cost). For a step of B
// sequences it picks the k in 0..K that maximises expected tokens per second,
//   E(k) / cost(B, k),   E(k) = 1 + sum_{j=1..k} P(drafts 1..j all accepted),
// where k = 0 is plain decode (no verify rows, no MTP pass) and cost(B, k) is the measured period of
// steady decode steps of that shape at B's batch bucket (DecodeGraphs::batch_bucket). The prefix
// acceptance P is counted per draft position over recent steps (decayed counts). A shape with too few
// samples is tried first (exploration), and every kReprobe decisions at a bucket the shapes not chosen
// are measured again (costs drift with context length, acceptance with the text). With "fixed"
// gating it always answers K. Single-threaded: the engine thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

namespace beluga {

class SpecGate {
 public:
  SpecGate(int max_k, bool fixed);

  static constexpr int kMinSamples = 3;   // measured periods before a shape's cost is trusted
  static constexpr int kSkipSamples = 1;  // first periods of a shape dropped (graph recording)
  static constexpr int kReprobe = 512;    // decisions at a bucket between re-measurements

  // Drafts per sequence for the next decode step of `batch` sequences (0: plain decode).
  int choose(int batch);
  // A steady decode step of `batch` sequences verifying `k` drafts each (k = 0: plain, no MTP pass)
  // took `seconds` from the previous step's results to its own.
  void observe_cost(int batch, int k, double seconds);
  // One sequence-step verified `verified` drafts and accepted the first `accepted` of them.
  void observe_acceptance(int verified, int accepted);

  // P(drafts 1..j all accepted), j >= 1, from the decayed counts (a prior of 1/2 per position).
  double prefix_acceptance(int j) const;
  double expected_tokens(int k) const;
  // The measured cost of a shape, or < 0 while it has fewer than kMinSamples samples.
  double cost(int batch, int k) const;
  int max_k() const { return max_k_; }

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
  Bucket& bucket(int batch);

  int max_k_;
  bool fixed_;
  std::map<int, Bucket> buckets_;       // batch bucket -> costs
  std::vector<double> tried_, passed_;  // [K]: decayed sequence-steps reaching / accepting position j
};

}  // namespace beluga
