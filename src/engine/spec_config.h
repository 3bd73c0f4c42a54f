// Speculative decoding's settings, as vLLM spells them (--speculative-config JSON):
//   {"method": "mtp" | "deepseek_mtp", "num_speculative_tokens": K, "gating": "cost" | "fixed",
//    "synthetic_acceptance": P}
// "gating": "cost" (default) lets SpecGate pick 0..K drafts per decode step from measured acceptance and
// step cost (plain decode where verifying costs more than it gains); "fixed" always verifies K.
// "synthetic_acceptance" (benchmarks only) accepts each draft token with probability P whatever the
// target model says, so output is no longer the model's; it measures the engine at a fixed acceptance.
#pragma once

#include <string>

namespace beluga {

struct SpecConfig {
  enum class Method { kNone, kMtp } method = Method::kNone;
  int num_speculative_tokens = 0;
  double synthetic_acceptance = -1;  // < 0: off (drafts are verified against the target model)
  bool fixed_gating = false;         // "gating": "fixed"
  bool enabled() const { return method != Method::kNone && num_speculative_tokens > 0; }
};

// Parses the JSON object; throws beluga::Error naming the bad field on anything invalid (unknown
// method or key, K outside 1..8, P outside [0, 1], gating other than "cost" or "fixed"). "ngram" is
// recognised and refused (not built yet).
SpecConfig parse_spec_config(const std::string& json);

}  // namespace beluga
