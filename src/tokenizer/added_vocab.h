// Added tokens of a tokenizer.json (`added_tokens`): control tokens such as <｜User｜> that are
// matched in the text before the normalizer and BPE run, with Hugging Face's rules: leftmost-longest
// match, `lstrip`/`rstrip` swallow adjacent whitespace, `single_word` only matches whole words, and
// tokens flagged `normalized` are matched in normalized text (the others in the raw text).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/function_ref.h"

namespace beluga::tok {

class Normalizer;

struct AddedToken {
  int id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

class AddedVocab {
 public:
  // `norm` is applied to the content of `normalized` tokens, so they match normalized text.
  void build(std::vector<AddedToken> tokens, const Normalizer& norm);

  bool empty() const { return tokens_.empty(); }
  const std::vector<AddedToken>& tokens() const { return tokens_; }
  const AddedToken* find_id(int id) const;
  const AddedToken* find_content(std::string_view content) const;

  // Splits text into runs of plain text (on_text) and matched tokens (on_token), in order, using the
  // tokens with normalized == `normalized_pass`.
  void split(std::string_view text, bool normalized_pass, FunctionRef<void(std::string_view)> on_text,
             FunctionRef<void(const AddedToken&)> on_token) const;

 private:
  // A byte trie; `token` is the index into tokens_ of the token ending here, or -1.
  struct Node {
    std::vector<std::pair<unsigned char, int>> next;  // sorted by byte
    int token = -1;
  };
  struct Trie {
    std::vector<Node> nodes{Node{}};
    bool first[256] = {};  // bytes that can start a match: everything else is skipped fast
    void add(std::string_view key, int token);
    // Longest token starting at text[i], as (token index, length), or token index -1.
    std::pair<int, size_t> longest(std::string_view text, size_t i) const;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int, size_t> by_id_;
  std::unordered_map<std::string, size_t> by_content_;
  Trie raw_, normalized_;
};

}  // namespace beluga::tok
