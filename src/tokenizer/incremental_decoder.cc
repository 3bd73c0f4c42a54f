#include "tokenizer/incremental_decoder.h"

#include "tokenizer/utf8.h"

namespace beluga::tok {

std::string IncrementalDecoder::feed(int id) {
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_.append(tok_->token_bytes(id));
  size_t tail = 0;
  size_t ready = utf8_complete_prefix(pending_, tail);
  std::string out;
  utf8_append_lossy(out, std::string_view(pending_).substr(0, ready));
  pending_.erase(0, ready);
  return out;
}

std::string IncrementalDecoder::flush() {
  std::string out;
  utf8_append_lossy(out, pending_);
  pending_.clear();
  return out;
}

}  // namespace beluga::tok
