#include "engine/ngram_proposer.h"

#include <algorithm>
#include <cstddef>

namespace beluga {

int propose_ngram(std::span<const int> tokens, int min_n, int max_n, int k, std::span<int> out) {
  const ptrdiff_t len = ptrdiff_t(tokens.size());
  k = std::min<int>(k, int(out.size()));
  if (k <= 0 || min_n < 1) return 0;
  // Longest suffix first: a longer match predicts its continuation better.
  for (ptrdiff_t n = std::min<ptrdiff_t>(max_n, len - 1); n >= min_n; --n) {
    const int* suffix = tokens.data() + (len - n);
    // Most recent earlier occurrence first (nearer context is more likely to repeat); an occurrence
    // must leave at least one token after it before the suffix itself.
    for (ptrdiff_t i = len - n - 1; i >= 0; --i) {
      if (tokens[size_t(i)] != suffix[0] || !std::equal(suffix, suffix + n, tokens.data() + i)) continue;
      const ptrdiff_t from = i + n;
      const int m = int(std::min<ptrdiff_t>(k, len - from));
      std::copy_n(tokens.data() + from, m, out.data());
      return m;
    }
  }
  return 0;
}

}  // namespace beluga
