#include "tokenizer/word_cache.h"

#include <cstring>

namespace beluga::tok {

WordCache::WordCache() : slots_(kSlots) {
  keys_.reserve(kKeyArena);
  ids_.reserve(kIdArena);
  clear();
}

void WordCache::clear() {
  std::memset(static_cast<void*>(slots_.data()), 0, slots_.size() * sizeof(Slot));
  keys_.clear();
  ids_.clear();
  entries_ = 0;
}

bool WordCache::lookup(std::string_view word, uint64_t hash, std::vector<int>& out) const {
  if (word.size() > kMaxWordBytes) return false;
  for (size_t i = hash & (kSlots - 1);; i = (i + 1) & (kSlots - 1)) {
    const Slot& s = slots_[i];
    if (s.key_len == 0) return false;
    if (s.hash == hash && s.key_len == word.size() &&
        std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0) {
      out.insert(out.end(), ids_.data() + s.ids_off, ids_.data() + s.ids_off + s.ids_len);
      return true;
    }
  }
}

void WordCache::insert(std::string_view word, uint64_t hash, const int* ids, size_t n) {
  if (word.empty() || word.size() > kMaxWordBytes || n > kMaxWordBytes) return;
  if (entries_ >= kMaxEntries || keys_.size() + word.size() > kKeyArena || ids_.size() + n > kIdArena)
    clear();
  size_t i = hash & (kSlots - 1);
  while (slots_[i].key_len != 0) {
    const Slot& s = slots_[i];
    if (s.hash == hash && s.key_len == word.size() &&
        std::memcmp(keys_.data() + s.key_off, word.data(), word.size()) == 0)
      return;  // already present
    i = (i + 1) & (kSlots - 1);
  }
  slots_[i] = Slot{hash, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(ids_.size()),
                   static_cast<uint16_t>(word.size()), static_cast<uint16_t>(n)};
  keys_.append(word);
  ids_.insert(ids_.end(), ids, ids + n);
  ++entries_;
}

}  // namespace beluga::tok
