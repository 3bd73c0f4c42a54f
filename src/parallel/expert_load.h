// Routed-token counts per MoE layer and logical expert over a sliding window of engine steps: EPLB's
// input (eplb.h). Counts of the step in progress go to a scratch row; end_step() moves it into a ring
// of the last `window_steps` steps and keeps a running sum, so recording a step allocates nothing and
// reading the window is O(1) per entry. Memory: window_steps x layers x experts x 4 bytes (V3 decode's
// 1,000-step window over 58 x 256: 59 MB). Not thread-safe: one writer (the rank's step loop).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace beluga::parallel {

class ExpertLoadWindow {
 public:
  ExpertLoadWindow(int layers, int experts, int window_steps);

  int layers() const { return layers_; }
  int experts() const { return experts_; }
  int window_steps() const { return window_; }
  // Completed steps the window holds now (up to window_steps).
  int steps_in_window() const { return filled_; }

  // Counts `tokens` routed to (layer, expert) in the step in progress.
  void add(int layer, int expert, uint32_t tokens = 1);
  // Counts one layer's routing of this step: every entry of `expert_ids` (tokens x top-k, flattened)
  // is one routed token; ids outside [0, experts) are refused.
  void add_routing(int layer, std::span<const int32_t> expert_ids);
  // Closes the step in progress: it enters the window and the oldest step leaves once the window is full.
  void end_step();
  // Forgets every step (a new placement starts its statistics afresh, as DeepSeek's EPLB does).
  void clear();

  // The window's total for (layer, expert); the step in progress is not included.
  int64_t load(int layer, int expert) const { return sum_[index(layer, expert)]; }
  std::span<const int64_t> layer_load(int layer) const;
  // The window as EPLB's input, [layers][experts].
  std::vector<std::vector<double>> loads() const;

 private:
  size_t index(int layer, int expert) const { return size_t(layer) * size_t(experts_) + size_t(expert); }

  int layers_, experts_, window_;
  int filled_ = 0;                 // completed steps in the ring
  int next_ = 0;                   // ring row the next completed step goes to (the oldest once full)
  std::vector<uint32_t> ring_;     // window x layers x experts
  std::vector<uint32_t> current_;  // layers x experts, the step in progress
  std::vector<int64_t> sum_;       // layers x experts, the sum over the ring
};

}  // namespace beluga::parallel
