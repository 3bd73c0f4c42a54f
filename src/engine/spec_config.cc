#include "engine/spec_config.h"

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace beluga {

SpecConfig parse_spec_config(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(str("--speculative-config is not valid JSON: ", e.what()));
  }
  BELUGA_CHECK(j.is_object(), "--speculative-config must be a JSON object");
  SpecConfig c;
  for (const auto& [key, v] : j.items()) {
    if (key == "method") {
      BELUGA_CHECK(v.is_string(), "--speculative-config: \"method\" must be a string");
      const std::string m = v.get<std::string>();
      if (m == "mtp" || m == "deepseek_mtp")
        c.method = SpecConfig::Method::kMtp;
      else if (m == "ngram")
        c.method = SpecConfig::Method::kNgram;
      else
        throw Error(str("--speculative-config: unknown method \"", m,
                        "\" (expected \"mtp\", \"deepseek_mtp\" or \"ngram\")"));
    } else if (key == "num_speculative_tokens") {
      BELUGA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 8,
                   "--speculative-config: \"num_speculative_tokens\" must be an integer from 1 to 8");
      c.num_speculative_tokens = v.get<int>();
    } else if (key == "synthetic_acceptance") {
      BELUGA_CHECK(v.is_number() && v.get<double>() >= 0 && v.get<double>() <= 1,
                   "--speculative-config: \"synthetic_acceptance\" must be a number in [0, 1]");
      c.synthetic_acceptance = v.get<double>();
    } else if (key == "gating") {
      const std::string g = v.is_string() ? v.get<std::string>() : "";
      BELUGA_CHECK(g == "confidence" || g == "cost" || g == "fixed",
                   "--speculative-config: \"gating\" must be \"confidence\", \"cost\" or \"fixed\"");
      c.gating = g == "fixed"  ? SpecGate::Mode::kFixed
                 : g == "cost" ? SpecGate::Mode::kCost
                               : SpecGate::Mode::kConfidence;
    } else if (key == "prompt_lookup_min" || key == "prompt_lookup_max") {
      BELUGA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() <= 32,
                   "--speculative-config: \"", key, "\" must be an integer from 1 to 32");
      (key == "prompt_lookup_min" ? c.prompt_lookup_min : c.prompt_lookup_max) = v.get<int>();
    } else {
      throw Error(
          str("--speculative-config: unknown key \"", key,
              "\" (known: method, num_speculative_tokens, gating, prompt_lookup_min, prompt_lookup_max, "
              "synthetic_acceptance)"));
    }
  }
  BELUGA_CHECK(c.method != SpecConfig::Method::kNone, "--speculative-config: \"method\" is required");
  BELUGA_CHECK(c.num_speculative_tokens > 0, "--speculative-config: \"num_speculative_tokens\" is required");
  if (c.method == SpecConfig::Method::kNgram) {
    if (c.prompt_lookup_min == 0 && c.prompt_lookup_max == 0) c.prompt_lookup_min = c.prompt_lookup_max = 5;
    if (c.prompt_lookup_min == 0) c.prompt_lookup_min = c.prompt_lookup_max;
    if (c.prompt_lookup_max == 0) c.prompt_lookup_max = c.prompt_lookup_min;
    BELUGA_CHECK(c.prompt_lookup_min <= c.prompt_lookup_max,
                 "--speculative-config: \"prompt_lookup_min\" must not exceed \"prompt_lookup_max\"");
  } else {
    BELUGA_CHECK(
        c.prompt_lookup_min == 0 && c.prompt_lookup_max == 0,
        "--speculative-config: \"prompt_lookup_min\"/\"prompt_lookup_max\" apply to method \"ngram\" only");
  }
  return c;
}

}  // namespace beluga
