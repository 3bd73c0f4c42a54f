// libFuzzer target: config.json -> ModelConfig (loader/model_config.h). Contract: an unusable config
// is a beluga::Error naming the problem; nothing else escapes (no nlohmann type errors), no sanitizer
// report.
#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "loader/model_config.h"
#include "util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;  // from_file reports invalid JSON itself; here only values matter
  beluga::fuzz::expect_only<beluga::Error>([&] { (void)beluga::ModelConfig::from_json(j); });
  return 0;
}
