// A Hugging Face tokenizer.json (byte-level BPE: GPT-2, Llama-3, Qwen, DeepSeek families), giving the
// same ids as the `tokenizers` library. Pipeline: added tokens -> normalizer -> pre-tokenizer -> BPE.
//
// encode(text, allow_special): with allow_special=false no added token is matched, so text that
// spells a control token (e.g. user text "<｜User｜>") is encoded as ordinary text and can never yield
// that token's id. Invalid UTF-8 is repaired (each maximal invalid subpart becomes U+FFFD) before
// encoding. All const methods are thread-safe; copies share the same immutable data.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace beluga::tok {

struct AddedToken;

class Tokenizer {
 public:
  static Tokenizer from_file(const std::string& path);
  static Tokenizer from_json(std::string_view json_text);

  std::vector<int> encode(std::string_view text, bool allow_special) const;
  // Appends to out instead of returning a new vector (lets callers reuse one buffer).
  void encode_into(std::string_view text, bool allow_special, std::vector<int>& out) const;

  // Text of ids; invalid UTF-8 across token boundaries becomes U+FFFD; unknown ids are skipped
  // (as Hugging Face does), e.g. padding rows of a model's embedding.
  std::string decode(std::span<const int> ids, bool skip_special = false) const;

  int token_id(std::string_view token) const;  // by vocabulary spelling or added content; -1 if none
  std::string_view token_text(int id) const;   // the spelling in tokenizer.json ("" if no such id)
  std::string_view token_bytes(int id) const;  // the raw bytes the token decodes to ("" if none)
  bool is_special(int id) const;               // an added token flagged `special`
  bool is_added(int id) const;                 // any added token (special or not)
  const std::vector<AddedToken>& added_tokens() const;
  size_t vocab_size() const;  // one past the largest id

 private:
  struct Impl;
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace beluga::tok
