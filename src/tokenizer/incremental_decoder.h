// Streaming detokenizer: turns generated ids into text as they arrive, holding back the bytes of a
// UTF-8 character that a later token will complete, so every chunk it returns is valid UTF-8.
// Invalid byte sequences come out as U+FFFD, and the chunks concatenated equal Tokenizer::decode of
// all ids. One decoder per stream; it refers to (and must not outlive) its Tokenizer.
#pragma once

#include <string>

#include "tokenizer/tokenizer.h"

namespace beluga::tok {

class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = false)
      : tok_(&tokenizer), skip_special_(skip_special) {}

  // The text that became complete with this token (possibly empty).
  std::string feed(int id);
  // Whatever is still held back (an unfinished character becomes U+FFFD); resets the decoder.
  std::string flush();
  // Bytes currently held back.
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace beluga::tok
