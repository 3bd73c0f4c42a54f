#include "engine/step_masks.h"

#include <algorithm>

namespace beluga {

void clear_ids(uint32_t* mask, const std::vector<int>& ids, int vocab) {
  for (int t : ids)
    if (t >= 0 && t < vocab) mask[t >> 5] &= ~(1u << (t & 31));
}

bool allows_none(const uint32_t* mask, size_t words) {
  return std::all_of(mask, mask + words, [](uint32_t w) { return !w; });
}

void StepMasks::clear() {
  jobs_.clear();
  offsets_.clear();
  clears_.clear();
  dropped_.clear();
}

int StepMasks::add(LogitsProcessor* proc, size_t offset, const std::vector<int>* clear) {
  jobs_.push_back({proc, nullptr, {}});
  offsets_.push_back(offset);
  clears_.push_back(clear);
  dropped_.push_back(false);
  return int(jobs_.size()) - 1;
}

void StepMasks::fill(uint32_t* buffer, int vocab) {
  const size_t words = (size_t(vocab) + 31) / 32;
  live_.clear();
  live_index_.clear();
  for (size_t j = 0; j < jobs_.size(); ++j) {
    jobs_[j].mask = buffer + offsets_[j];
    if (dropped_[j]) {
      std::fill_n(jobs_[j].mask, words, ~0u);
    } else {
      live_.push_back(jobs_[j]);
      live_index_.push_back(j);
    }
  }
  filler_.fill(live_, vocab);
  for (size_t i = 0; i < live_.size(); ++i) jobs_[live_index_[i]].error = std::move(live_[i].error);
  problems_.assign(jobs_.size(), {});
  for (size_t j = 0; j < jobs_.size(); ++j) {
    if (dropped_[j]) continue;
    if (!jobs_[j].error.empty()) {
      problems_[j] = jobs_[j].error;
      continue;
    }
    if (clears_[j]) clear_ids(jobs_[j].mask, *clears_[j], vocab);
    if (allows_none(jobs_[j].mask, words))
      problems_[j] = "structured output: no token can continue the output";
  }
}

bool StepMasks::all_usable() const {
  return std::all_of(problems_.begin(), problems_.end(), [](const std::string& p) { return p.empty(); });
}

}  // namespace beluga
