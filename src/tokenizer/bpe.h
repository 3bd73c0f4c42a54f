// The byte-level BPE model of a tokenizer.json: vocabulary, merge ranks, and the merge loop.
// A word (raw bytes from the pre-tokenizer) starts as one symbol per byte and merges the lowest-ranked
// adjacent pair first (leftmost on ties) until no rule applies, using a binary heap over a linked list
// of symbols: O(n log n) per word instead of the naive O(n^2). Results are cached per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tokenizer/merge_table.h"

namespace beluga::tok {

class Bpe {
 public:
  // Parses the `model` object (type BPE); the vocabulary must spell bytes in the byte-level alphabet.
  static Bpe from_json(const nlohmann::json& model);

  // Appends the ids of one word. Thread-safe.
  void encode_word(std::string_view word, std::vector<int>& out) const;

  // Vocabulary: ids run from 0 to id_limit() - 1 (there may be holes).
  size_t id_limit() const { return spelling_.size(); }
  bool has_id(int id) const { return id >= 0 && size_t(id) < spelling_.size() && present_[id]; }
  const std::string& spelling(int id) const { return spelling_[id]; }  // as written in tokenizer.json
  const std::string& bytes(int id) const { return bytes_[id]; }        // raw bytes it stands for
  int id_of_spelling(std::string_view s) const;                        // -1 if absent

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  using Map = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;

  void merge_word(std::string_view word, std::vector<int>& out) const;

  std::vector<std::string> spelling_, bytes_;
  std::vector<uint8_t> present_;
  Map by_spelling_, by_bytes_;
  MergeTable merges_;
  int byte_id_[256];
  int unk_id_ = -1;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  uint64_t instance_;  // distinguishes this model in the per-thread caches
};

}  // namespace beluga::tok
