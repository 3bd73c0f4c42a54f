// The tokenizer's vocabulary as the matcher sees it: each id's raw bytes, which ids may ever be
// sampled under a grammar (never special tokens, never ids without bytes), the end-of-sequence ids
// (allowed only where the grammar accepts), and a byte trie over the allowed tokens, so a mask walk
// that rejects a prefix skips every token under it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace beluga::tok {
class Tokenizer;
}

namespace beluga::grammar {

class TokenVocab {
 public:
  struct TrieNode {
    uint32_t child_begin = 0, child_end = 0;  // into children()
    uint32_t tok_lo = 0, tok_hi = 0;          // the subtree's tokens: sorted()[tok_lo, tok_hi)
    uint32_t n_end = 0;                       // sorted()[tok_lo, tok_lo + n_end) end at this node
  };
  struct Child {
    uint8_t byte;
    uint32_t node;
  };

  // `eos` are the ids that end generation (allowed only in accepting states). `model_vocab`: the model's
  // logit count when it exceeds the tokenizer's (padded embeddings, or a benchmark serving a model with
  // another model's tokenizer): ids past the tokenizer have no bytes and are never allowed, but an EOS
  // id among them still ends generation.
  TokenVocab(const tok::Tokenizer& tokenizer, std::vector<int> eos, size_t model_vocab = 0);
  // A vocabulary from raw byte strings (index = id); `special` ids are never allowed. For tests.
  TokenVocab(std::vector<std::string> bytes, std::vector<int> special, std::vector<int> eos);

  size_t size() const { return bytes_.size(); }
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(int id) const { return bytes_[id]; }
  bool allowed(int id) const { return (valid_[id >> 5] >> (id & 31)) & 1; }
  const std::vector<uint32_t>& valid_mask() const { return valid_; }  // the allowed ids as a bitmask
  const std::vector<int>& eos() const { return eos_; }

  const std::vector<TrieNode>& trie() const { return trie_; }  // node 0 is the root (empty prefix)
  const std::vector<Child>& children() const { return children_; }
  const std::vector<int32_t>& sorted() const { return sorted_; }  // allowed ids by their bytes
  size_t max_token_bytes() const { return max_bytes_; }           // the longest allowed token

 private:
  void build(const std::vector<uint8_t>& forbidden);
  uint32_t build_node(uint32_t lo, uint32_t hi, uint32_t depth);

  std::vector<std::string> bytes_;
  std::vector<uint32_t> valid_;
  std::vector<int> eos_;
  std::vector<TrieNode> trie_;
  std::vector<Child> children_;
  std::vector<int32_t> sorted_;
  size_t max_bytes_ = 0;
};

}  // namespace beluga::grammar
