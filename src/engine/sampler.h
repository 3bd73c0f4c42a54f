// Sampler: turns one row of logits into the next token for one sequence, applying SamplingParams in
// the documented order (request.h), and computes logprobs from the model's raw distribution.
// Cost per token: O(vocab) passes plus sorting only the candidates a filter can keep (top_k, top_p
// and min_p by partial selection, never a sort of the whole vocabulary); penalties from the
// sequence's running counts (output_counts) and, for repetition, the request's distinct prompt
// tokens (prompt_set), not a per-step sort of the prompt. Allocation-free once its buffers are sized.
#pragma once

#include <unordered_map>
#include <vector>

#include "backend/sample_rows.h"
#include "engine/request.h"

namespace beluga {

struct SampleContext {
  const SamplingParams* params;
  const std::vector<int>* prompt;
  const std::unordered_map<int, int>* output_counts;  // token -> times generated so far
  int num_output;                                     // tokens generated so far
  const std::vector<int>* stop_ids;                   // EOS + stop_token_ids (masked before min_tokens)
  uint64_t seed;                                      // per request
  int seq_index;
  const uint32_t* allowed = nullptr;  // structured output: bitmask of the tokens allowed (null: all)
  // The prompt's distinct tokens, sorted (distinct_tokens()), kept by the caller for the request's
  // life; null: the sampler dedups `prompt` itself each step (O(prompt), no sort).
  const std::vector<int>* prompt_set = nullptr;
};

// A prompt's distinct tokens, sorted: SampleContext::prompt_set.
std::vector<int> distinct_tokens(const std::vector<int>& prompt);

struct SampleResult {
  int token;
  TokenLogprob logprob;  // filled when params->logprobs >= 0
};

// `logits` is modified in place (used as scratch); `scratch` holds vocab-sized work space.
SampleResult sample(float* logits, int vocab, const SampleContext& ctx, std::vector<float>& scratch,
                    std::vector<int>& index_scratch);

// The logprob entry of `token` for one row of raw logits, as sample() computes logprobs: log-softmax
// of the model's distribution, `token`'s rank in it, and the top `k` alternatives (k = 0: none). For
// prompt logprobs, where the token is given instead of sampled. `logits` is left unchanged.
TokenLogprob token_logprob(const float* logits, int vocab, int token, int k, std::vector<float>& scratch,
                           std::vector<int>& index_scratch);

// The draw of a device sampler's row (backend/sample_rows.h) from logits its edits and mask were already
// applied to: sample()'s argmax or filtered draw, with the row's uniform.
int sample_row(const float* logits, int vocab, const DeviceSampleRow& row, std::vector<int>& index_scratch);

// Whether sample() draws from the raw logits alone (any temperature, top_k, top_p, min_p): no logprobs
// and nothing that edits the logits (logit bias, penalties, structured output, min_tokens' masking of
// stop ids). Its distribution at a later position then depends on nothing sampled in between, so
// drafts can be verified against several rows at once (speculative decoding: draft_verifier.h).
bool samples_speculatively(const SampleContext& ctx);

// Whether sample() would return the argmax of the raw logits (ties: the lowest id): greedy with no
// logprobs and nothing that edits the logits. Such rows can be sampled on the device (the engine then
// copies one id per row instead of the logits).
bool samples_raw_argmax(const SampleContext& ctx);

// Whether sample() for this row needs no more than the device sampler takes (backend/sample_rows.h):
// top logprobs only up to kMaxTopLogprobs and without logit bias or penalties. The caller folds
// ctx.allowed and min_tokens' masked stop ids into the row's bitmask.
bool samples_on_device(const SampleContext& ctx);
// The device sampler's row for a row samples_on_device() accepts (no mask: mask_row -1), with the
// same uniform sample() would draw. Its logit bias and penalties become edits appended to `edits`
// (one per token: bias, the repetition set of prompt and output, output counts); with
// `reserve_pending`, one more entry is left free after them for the token the step ahead is still
// sampling (DeviceSampling::resolve_pending counts it).
DeviceSampleRow device_sample_row(const SampleContext& ctx, std::vector<DeviceLogitEdit>* edits = nullptr,
                                  bool reserve_pending = false);
// Whether the row's logits are edited (logit bias or a penalty).
bool edits_logits(const SamplingParams& p);

// A uniform double in [0, 1) from (seed, sequence, step), independent of batch composition.
double sample_uniform(uint64_t seed, int seq_index, int step);

}  // namespace beluga
