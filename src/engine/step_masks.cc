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
}

int StepMasks::add(LogitsProcessor* proc, size_t offset, const std::vector<int>* clear) {
  jobs_.push_back({proc, nullptr, {}});
  offsets_.push_back(offset);
  clears_.push_back(clear);
  return int(jobs_.size()) - 1;
}

void StepMasks::fill(uint32_t* buffer, int vocab) {
  const size_t words = (size_t(vocab) + 31) / 32;
  for (size_t j = 0; j < jobs_.size(); ++j) jobs_[j].mask = buffer + offsets_[j];
  filler_.fill(jobs_, vocab);
  problems_.assign(jobs_.size(), {});
  for (size_t j = 0; j < jobs_.size(); ++j) {
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
