// Draft verification for speculative decoding (Leviathan et al. / Chen et al. 2023, "speculative
// sampling") with one-hot drafts: MTP's argmax and prompt lookup both propose a single token x per row,
// so the draft distribution q is the point mass at x.
//
// The rule: row j's draft x_j is accepted with probability p_j(x_j), p_j the distribution the sequence
// samples its next token from at that row (after temperature, top_k, top_p, min_p: sampler.h); on
// rejection the row emits a token from norm(max(p_j - q_j, 0)), i.e. p_j with x_j removed and
// renormalized, and verification stops; with every draft accepted, the row after the last one emits
// a bonus token from p_{k+1}. The output is distributed exactly as sampling the target token by token.
//
// The randomness: row j draws y_j ~ p_j with the uniform sample() would use for that output position
// (seed, sequence, ctx.num_output + j), accepts iff y_j == x_j and emits y_j. P(accept) = p_j(x_j),
// and given a rejection y_j is p_j conditioned on y_j != x_j = norm(p_j - q_j): the rule above, with
// the acceptance test and the residual draw coupled through one uniform. So a seeded sequence emits
// the same tokens whether or not (and however many) drafts were proposed, which keeps a seeded
// request reproducible although the cost gate's draft counts depend on timing. Greedy rows
// (temperature 0) reduce to "accepted while equal to the argmax".
#pragma once

#include <vector>

#include "engine/sampler.h"

namespace beluga {

// `logits`: k + 1 consecutive rows of `vocab` (used as scratch, as by sample()); row j is the target
// after draft j (row 0: after the sequence's last token). `ctx` is the sequence's context at row 0
// (samples_speculatively(ctx) holds: nothing edits the logits row by row). Writes the emitted tokens
// to tokens[0..a] and returns a, the drafts accepted (0..k): tokens[j] = drafts[j] for j < a, and
// tokens[a] is the correction (a < k) or the bonus token (a = k).
int verify_drafts(float* logits, int vocab, const SampleContext& ctx, const int* drafts, int k, int* tokens,
                  std::vector<float>& scratch, std::vector<int>& index_scratch);

}  // namespace beluga
