// libFuzzer target: /v1/responses request bodies through build_request (see request_fuzz.h).
#include "request_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return beluga::fuzz::fuzz_request(beluga::server::ServerApi::kResponses, data, size);
}
