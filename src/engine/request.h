// What a client asks of the engine (token ids + sampling parameters) and what comes back
// (new tokens per sequence, logprobs, finish reasons, cache accounting). No JSON, no text: the
// server and recipe layers own those.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/logits_processor.h"

namespace beluga {

// Applied in this order to each step's logits (docs/sampling.md): logit_bias; repetition,
// presence and frequency penalties (over prompt+output for repetition, output for the others);
// min_tokens (stop tokens masked until reached); temperature (0 = greedy, and the rest is skipped);
// top_k; top_p; min_p; then one draw from a generator keyed by (seed, sequence index, step) so a
// seeded request gives the same tokens whatever else is in the batch.
struct SamplingParams {
  float temperature = 1.0f;
  float top_p = 1.0f;
  int top_k = 0;  // 0: off
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::map<int, float> logit_bias;
  std::optional<uint64_t> seed;
  int logprobs = -1;  // -1: none; 0: the chosen token's; k: also the top k
  // -1: none; k >= 0: each prompt token's logprob given the tokens before it (the first has none),
  // with the top k alternatives, from the raw distribution like `logprobs`. The prompt is computed,
  // not taken from the prefix cache (its logits are needed).
  int prompt_logprobs = -1;
  int max_tokens = 256;
  int min_tokens = 0;
  std::vector<int> stop_token_ids;  // in addition to the model's EOS unless ignore_eos
  bool ignore_eos = false;
  int n = 1;  // independent samples of the same prompt
};

enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

struct TokenLogprob {
  int token = 0;
  float logprob = 0.0f;
  std::vector<std::pair<int, float>> top;  // (token, logprob), best first
  int rank = 0;  // 1-based: how many tokens are at least as likely (itself included), as vLLM counts
};

struct SeqOutput {
  int index = 0;                       // 0..n-1
  std::vector<int> tokens;             // new tokens since the last output
  std::vector<TokenLogprob> logprobs;  // one per new token when requested
  FinishReason finish = FinishReason::kNone;
  int stop_token = -1;  // the token that stopped it (kStop), not included in tokens
};

struct RequestOutput {
  std::string request_id;
  std::vector<SeqOutput> seqs;  // sequences with news in this step
  int prompt_tokens = 0;
  int cached_tokens = 0;  // prompt tokens served from the prefix cache (multiple of the block size)
  // Of which loaded from below the device pool (KV connector): from host memory, from the file tier.
  int cached_tokens_host = 0, cached_tokens_disk = 0;
  bool finished = false;  // every sequence has finished; no further output for this request
  // With sampling.prompt_logprobs >= 0: prompt tokens 1..P-1 in order (token 0 has none), delivered
  // once, in the output with the request's first sampled token (its first output, unless it failed).
  std::vector<TokenLogprob> prompt_logprobs;
  std::string error;  // set with FinishReason::kError
  // With `error`: the instance could not run the request (util/error.h Unavailable: a failed rank), not
  // the request's fault; servers answer 503 so a router retries it elsewhere.
  bool unavailable = false;
};

// Called on the engine thread, in order, once per step with news; must return quickly.
using OutputCallback = std::function<void(RequestOutput&&)>;

struct EngineRequest {
  std::string id;
  std::vector<int> prompt;
  SamplingParams sampling;
  std::string cache_salt;              // tenants with different salts never share prefix-cache entries
  std::string traffic_class = "chat";  // the retention class of its KV below the device pool
  OutputCallback on_output;
  // Structured output: when set, each sequence's tokens are constrained by its own processor (the
  // sampler masks disallowed tokens; end-of-sequence only where the processor accepts).
  LogitsProcessorFactory logits_processor;
};

}  // namespace beluga
