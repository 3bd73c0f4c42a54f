#include "grammar/vocab.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace beluga::grammar {

TokenVocab::TokenVocab(const tok::Tokenizer& tokenizer, std::vector<int> eos, size_t model_vocab)
    : eos_(std::move(eos)) {
  const size_t n = tokenizer.vocab_size();
  bytes_.resize(std::max(n, model_vocab));
  std::vector<uint8_t> forbidden(bytes_.size(), 0);
  for (size_t id = 0; id < n; ++id) {
    bytes_[id] = std::string(tokenizer.token_bytes(int(id)));
    if (tokenizer.is_special(int(id))) forbidden[id] = 1;
  }
  build(forbidden);
}

TokenVocab::TokenVocab(std::vector<std::string> bytes, std::vector<int> special, std::vector<int> eos)
    : bytes_(std::move(bytes)), eos_(std::move(eos)) {
  std::vector<uint8_t> forbidden(bytes_.size(), 0);
  for (int id : special) forbidden.at(id) = 1;
  build(forbidden);
}

void TokenVocab::build(const std::vector<uint8_t>& forbidden) {
  for (int id : eos_)
    BELUGA_CHECK(id >= 0 && size_t(id) < bytes_.size(), "end-of-sequence id ", id, " out of range");
  valid_.assign(mask_words(), 0);
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (forbidden[id] || bytes_[id].empty()) continue;
    valid_[id >> 5] |= uint32_t(1) << (id & 31);
    sorted_.push_back(int32_t(id));
    max_bytes_ = std::max(max_bytes_, bytes_[id].size());
  }
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b; });
  trie_.clear();
  children_.clear();
  build_node(0, uint32_t(sorted_.size()), 0);
}

// Tokens sorted()[lo, hi) share their first `depth` bytes; the node for that prefix is built with its
// children's nodes following it (children's Child entries are contiguous).
uint32_t TokenVocab::build_node(uint32_t lo, uint32_t hi, uint32_t depth) {
  uint32_t id = uint32_t(trie_.size());
  trie_.push_back({});
  uint32_t i = lo;
  while (i < hi && bytes_[sorted_[i]].size() == depth) ++i;
  trie_[id].tok_lo = lo;
  trie_[id].tok_hi = hi;
  trie_[id].n_end = i - lo;
  // Group the rest by their byte at `depth`.
  std::vector<std::pair<uint8_t, std::pair<uint32_t, uint32_t>>> groups;
  while (i < hi) {
    uint8_t b = uint8_t(bytes_[sorted_[i]][depth]);
    uint32_t j = i;
    while (j < hi && uint8_t(bytes_[sorted_[j]][depth]) == b) ++j;
    groups.push_back({b, {i, j}});
    i = j;
  }
  uint32_t cb = uint32_t(children_.size());
  children_.resize(cb + groups.size());
  trie_[id].child_begin = cb;
  trie_[id].child_end = cb + uint32_t(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    uint32_t child = build_node(groups[g].second.first, groups[g].second.second, depth + 1);
    children_[cb + g] = {groups[g].first, child};
  }
  return id;
}

}  // namespace beluga::grammar
