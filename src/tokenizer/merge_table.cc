#include "tokenizer/merge_table.h"

namespace beluga::tok {

void MergeTable::reserve(size_t n) {
  while (entries_.size() < 2 * n) grow();
}

void MergeTable::grow() {
  std::vector<Entry> old;
  old.swap(entries_);
  entries_.assign(old.size() * 2, Entry{kEmpty, {0, 0}});
  mask_ = entries_.size() - 1;
  --shift_;
  size_ = 0;
  for (const Entry& e : old) {
    if (e.key == kEmpty) continue;
    for (size_t i = slot(e.key);; i = (i + 1) & mask_) {
      if (entries_[i].key == kEmpty) {
        entries_[i] = e;
        ++size_;
        break;
      }
    }
  }
}

void MergeTable::insert(int32_t left, int32_t right, Merge m) {
  if (2 * (size_ + 1) > entries_.size()) grow();  // keep the load at most 1/2
  uint64_t k = key(left, right);
  for (size_t i = slot(k);; i = (i + 1) & mask_) {
    if (entries_[i].key == k) {
      entries_[i].merge = m;
      return;
    }
    if (entries_[i].key == kEmpty) {
      entries_[i] = Entry{k, m};
      ++size_;
      return;
    }
  }
}

}  // namespace beluga::tok
