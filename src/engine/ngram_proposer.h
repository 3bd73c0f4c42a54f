// Prompt-lookup (n-gram) drafting, vLLM's "ngram" method, for models without an MTP module: the
// sequence's last n tokens (n from max_n down to min_n) are looked up earlier in the sequence (prompt
// and output so far); the tokens that followed their most recent earlier occurrence are the drafts.
// Verification (SpecDecoder) decides what is kept, so a poor proposal costs verify rows, never output.
#pragma once

#include <span>

namespace beluga {

// Writes up to min(k, out.size()) drafts to `out` and returns how many (0: no earlier occurrence of
// any suffix of length min_n..max_n). O(tokens.size() * max_n); allocates nothing.
int propose_ngram(std::span<const int> tokens, int min_n, int max_n, int k, std::span<int> out);

}  // namespace beluga
