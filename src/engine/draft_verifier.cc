#include "engine/draft_verifier.h"

#include "util/error.h"

namespace beluga {

int verify_drafts(float* logits, int vocab, const SampleContext& ctx, const int* drafts, int k, int* tokens,
                  std::vector<float>& scratch, std::vector<int>& index_scratch) {
  BELUGA_ASSERT(samples_speculatively(ctx));
  SampleContext row = ctx;
  for (int j = 0;; ++j) {
    row.num_output = ctx.num_output + j;  // the uniform of this output position, as without drafts
    tokens[j] = sample(logits + size_t(j) * size_t(vocab), vocab, row, scratch, index_scratch).token;
    if (j == k || tokens[j] != drafts[j]) return j;
  }
}

}  // namespace beluga
