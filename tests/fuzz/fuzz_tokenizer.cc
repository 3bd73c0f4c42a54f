// libFuzzer target: the tokenizer of the built-in model. The input's first byte picks the options,
// the rest is text: encode it (special-token matching on or off), then decode. A second pass reads
// the same bytes as token ids (unknown ids included) and decodes them at once and through the
// incremental detokenizer. Checked contracts (tokenizer.h, incremental_decoder.h): ids are in the
// vocabulary; with special-token matching off no special token comes out; the incremental chunks
// joined equal decode() of all ids; nothing throws.
#include "fuzz_support.h"
#include "tokenizer/incremental_decoder.h"

namespace {

void check_incremental(const beluga::tok::Tokenizer& t, const std::vector<int>& ids, bool skip_special) {
  beluga::tok::IncrementalDecoder d(t, skip_special);
  std::string joined;
  for (int id : ids) joined += d.feed(id);
  joined += d.flush();
  if (joined != t.decode(ids, skip_special))
    beluga::fuzz::finding("incremental decode differs from decode()");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const beluga::tok::Tokenizer& t = beluga::fuzz::demo_model().tokenizer;
  const uint8_t mode = data[0];
  const std::string_view text = beluga::fuzz::as_text(data + 1, size - 1);
  const bool allow_special = mode & 1, skip_special = mode & 2;

  const std::vector<int> ids = t.encode(text, allow_special);
  for (int id : ids) {
    if (id < 0 || size_t(id) >= t.vocab_size()) beluga::fuzz::finding("encode: id out of range");
    if (!allow_special && t.is_special(id)) beluga::fuzz::finding("encode: a special token from plain text");
  }
  check_incremental(t, ids, skip_special);

  // The bytes as 3-byte ids, past the vocabulary too (decode skips unknown ids).
  std::vector<int> raw;
  for (size_t i = 0; i + 3 <= text.size(); i += 3) {
    const int id = int((uint8_t(text[i]) << 16 | uint8_t(text[i + 1]) << 8 | uint8_t(text[i + 2])) %
                       (t.vocab_size() + 16));
    raw.push_back(mode & 4 ? id - 8 : id);  // negative ids too
  }
  check_incremental(t, raw, skip_special);
  return 0;
}
