// The token masks of one step's constrained rows: each row's processor writes its mask at an offset
// of a buffer the caller owns (the device sampling rows' masks, or a host buffer), all rows together
// (mask_filler.h); then the ids a row may not take yet (min_tokens' stop ids) are cleared, and each
// mask is judged usable or not: its processor threw, or it allows no token at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/mask_filler.h"

namespace beluga {

// Clears `ids` (those inside the vocabulary) in a mask of `vocab` ids.
void clear_ids(uint32_t* mask, const std::vector<int>& ids, int vocab);
// Whether a mask of `words` words allows no id.
bool allows_none(const uint32_t* mask, size_t words);

class StepMasks {
 public:
  // `filler` (shared by the engine's StepMasks, which fill one at a time) must outlive this.
  explicit StepMasks(MaskFiller& filler) : filler_(filler) {}

  void clear();
  // A row's mask at word `offset` of fill()'s buffer; `clear` (may be null): ids cleared after the
  // processor wrote. Returns the row's index among this step's masks.
  int add(LogitsProcessor* proc, size_t offset, const std::vector<int>* clear = nullptr);
  // Mask j is not needed after all (its sequence ended): fill() leaves every id allowed there and
  // does not call its processor.
  void drop(int j) { dropped_[size_t(j)] = true; }
  bool empty() const { return jobs_.empty(); }
  size_t size() const { return jobs_.size(); }

  // Fills every added mask into `buffer` (zeroed by the caller where processors write).
  void fill(uint32_t* buffer, int vocab);
  // After fill(): "" when mask j can be used, else why not.
  const std::string& problem(int j) const { return problems_[size_t(j)]; }
  bool all_usable() const;
  LogitsProcessor* proc(int j) const { return jobs_[size_t(j)].proc; }
  const uint32_t* mask(int j) const { return jobs_[size_t(j)].mask; }

 private:
  MaskFiller& filler_;
  std::vector<MaskFiller::Job> jobs_;
  std::vector<size_t> offsets_;
  std::vector<const std::vector<int>*> clears_;
  std::vector<std::string> problems_;
  std::vector<bool> dropped_;
  std::vector<MaskFiller::Job> live_;  // fill()'s jobs not dropped (kept: no allocation per step)
  std::vector<size_t> live_index_;
};

}  // namespace beluga
