// A bounded cache from a word's bytes to its BPE token ids, for one thread (the BPE model keeps one
// per thread, so lookups take no lock). Entries live in flat arenas: a hit copies ids out without
// allocating. When full, the cache starts over; frequent words come back at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace beluga::tok {

class WordCache {
 public:
  static constexpr size_t kMaxWordBytes = 255;  // longer words are rare and cheap to skip

  WordCache();

  // Appends the cached ids of word to out and returns true, or returns false on a miss.
  bool lookup(std::string_view word, uint64_t hash, std::vector<int>& out) const;
  void insert(std::string_view word, uint64_t hash, const int* ids, size_t n);
  void clear();

 private:
  struct Slot {
    uint64_t hash;
    uint32_t key_off, ids_off;
    uint16_t key_len, ids_len;  // key_len == 0 marks an empty slot
  };
  static constexpr size_t kSlots = size_t(1) << 14;
  static constexpr size_t kMaxEntries = kSlots / 2;
  static constexpr size_t kKeyArena = kMaxEntries * 24, kIdArena = kMaxEntries * 8;

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int> ids_;
  size_t entries_ = 0;
};

}  // namespace beluga::tok
