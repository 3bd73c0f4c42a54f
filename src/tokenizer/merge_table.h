// The BPE merge rules as a flat open-addressing hash table: (left id, right id) -> (rank, merged id).
// Looked up once per candidate pair in the merge loop, so it avoids node-based maps entirely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace beluga::tok {

class MergeTable {
 public:
  struct Merge {
    int32_t rank;    // position in the merges list; lower merges first
    int32_t result;  // id of the concatenated token
  };

  void reserve(size_t n);
  // Later insertions of the same pair replace earlier ones (as Hugging Face's HashMap collect does).
  void insert(int32_t left, int32_t right, Merge m);
  const Merge* find(int32_t left, int32_t right) const {
    uint64_t k = key(left, right);
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.key == k) return &e.merge;
      if (e.key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  struct Entry {
    uint64_t key;
    Merge merge;
  };
  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t k) const { return (k * 0x9E3779B97F4A7C15ull) >> shift_; }
  void grow();

  std::vector<Entry> entries_ = std::vector<Entry>(16, Entry{kEmpty, {0, 0}});
  size_t mask_ = 15;
  int shift_ = 60;
  size_t size_ = 0;
};

}  // namespace beluga::tok
