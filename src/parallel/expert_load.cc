#include "parallel/expert_load.h"

#include <algorithm>

#include "util/error.h"

namespace beluga::parallel {

ExpertLoadWindow::ExpertLoadWindow(int layers, int experts, int window_steps)
    : layers_(layers), experts_(experts), window_(window_steps) {
  BELUGA_CHECK(layers >= 1 && experts >= 1, "expert load window: layers and experts must be at least 1");
  BELUGA_CHECK(window_steps >= 1, "expert load window: the window must hold at least one step");
  const size_t row = size_t(layers) * size_t(experts);
  ring_.assign(row * size_t(window_steps), 0);
  current_.assign(row, 0);
  sum_.assign(row, 0);
}

void ExpertLoadWindow::add(int layer, int expert, uint32_t tokens) {
  BELUGA_CHECK(layer >= 0 && layer < layers_ && expert >= 0 && expert < experts_, "expert load: (", layer,
               ", ", expert, ") out of range");
  current_[index(layer, expert)] += tokens;
}

void ExpertLoadWindow::add_routing(int layer, std::span<const int32_t> expert_ids) {
  BELUGA_CHECK(layer >= 0 && layer < layers_, "expert load: layer ", layer, " out of range");
  uint32_t* row = current_.data() + index(layer, 0);
  for (int32_t e : expert_ids) {
    BELUGA_CHECK(e >= 0 && e < experts_, "expert load: expert id ", e, " out of range");
    ++row[e];
  }
}

void ExpertLoadWindow::end_step() {
  const size_t row = current_.size();
  uint32_t* slot = ring_.data() + size_t(next_) * row;
  // A full window drops its oldest step, the row this step overwrites.
  if (filled_ == window_)
    for (size_t i = 0; i < row; ++i) sum_[i] -= slot[i];
  else
    ++filled_;
  for (size_t i = 0; i < row; ++i) {
    slot[i] = current_[i];
    sum_[i] += current_[i];
    current_[i] = 0;
  }
  next_ = (next_ + 1) % window_;
}

void ExpertLoadWindow::clear() {
  std::fill(ring_.begin(), ring_.end(), 0u);
  std::fill(current_.begin(), current_.end(), 0u);
  std::fill(sum_.begin(), sum_.end(), int64_t{0});
  filled_ = next_ = 0;
}

std::span<const int64_t> ExpertLoadWindow::layer_load(int layer) const {
  BELUGA_CHECK(layer >= 0 && layer < layers_, "expert load: layer ", layer, " out of range");
  return {sum_.data() + index(layer, 0), size_t(experts_)};
}

std::vector<std::vector<double>> ExpertLoadWindow::loads() const {
  std::vector<std::vector<double>> out(static_cast<size_t>(layers_));
  for (int l = 0; l < layers_; ++l) {
    const auto row = layer_load(l);
    out[size_t(l)].assign(row.begin(), row.end());
  }
  return out;
}

}  // namespace beluga::parallel
