#include "grammar/grammar_processor.h"

#include <algorithm>
#include <cstring>

#include "util/error.h"

namespace beluga::grammar {

void GrammarProcessor::fill_mask(uint32_t* bitmask, int vocab) {
  size_t words = (size_t(vocab) + 31) / 32, own = m_.vocab().mask_words();
  if (words >= own) {
    m_.fill_mask(bitmask);
    std::memset(bitmask + own, 0, (words - own) * sizeof(uint32_t));
    // Bits past the tokenizer's last id inside its last word are already clear.
  } else {
    std::vector<uint32_t> full(own);
    m_.fill_mask(full.data());
    std::copy(full.begin(), full.begin() + long(words), bitmask);
  }
  if (vocab % 32) bitmask[words - 1] &= (uint32_t(1) << (vocab % 32)) - 1;
}

void GrammarProcessor::accept(int token) {
  BELUGA_CHECK(m_.accept_token(token), "structured output: token ", token, " does not fit the grammar");
}

LogitsProcessorFactory processor_factory(std::shared_ptr<const CompiledGrammar> g) {
  return [g] { return std::make_unique<GrammarProcessor>(g); };
}

}  // namespace beluga::grammar
