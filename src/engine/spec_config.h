// Speculative decoding's settings, as vLLM spells them (--speculative-config JSON):
//   {"method": "mtp" | "deepseek_mtp" | "ngram", "num_speculative_tokens": K,
//    "gating": "confidence" | "cost" | "fixed",
//    "prompt_lookup_min": N, "prompt_lookup_max": M, "synthetic_acceptance": P}
// "ngram" drafts by prompt lookup (engine/ngram_proposer.h) and needs no MTP module; its suffix lengths
// run from prompt_lookup_max down to prompt_lookup_min (as vLLM: when one is given the other defaults
// to it, when neither, both are 5).
// "gating" (SpecGate): "confidence" (default) verifies each sequence's drafts in order of their
// calibrated survival while expected tokens per second rise (plain decode where verifying costs more
// than it gains); "cost" the same with every draft at its position's mean acceptance (one depth for
// the whole batch); "fixed" always verifies K.
// "synthetic_acceptance" (benchmarks only) accepts each draft token with probability P whatever the
// target model says, so output is no longer the model's; it measures the engine at a fixed acceptance.
#pragma once

#include <string>

#include "engine/spec_gate.h"

namespace beluga {

struct SpecConfig {
  enum class Method { kNone, kMtp, kNgram } method = Method::kNone;
  int num_speculative_tokens = 0;
  double synthetic_acceptance = -1;  // < 0: off (drafts are verified against the target model)
  SpecGate::Mode gating = SpecGate::Mode::kConfidence;
  int prompt_lookup_min = 0;  // ngram only (set by the parser: 1 <= min <= max)
  int prompt_lookup_max = 0;
  bool enabled() const { return method != Method::kNone && num_speculative_tokens > 0; }
};

// Parses the JSON object; throws beluga::Error naming the bad field on anything invalid (unknown
// method or key, K outside 1..8, P outside [0, 1], gating other than "confidence", "cost" or "fixed", prompt
// lookup lengths outside 1..32 or min > max, or lookup lengths with a method other than "ngram").
SpecConfig parse_spec_config(const std::string& json);

}  // namespace beluga
