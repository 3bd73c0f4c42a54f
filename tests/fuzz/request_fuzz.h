// One API's request building as the server runs it (tests/fuzz/fuzz_<api>_request.cc): body bytes
// -> build_request with the built-in model's tokenizer and chat encoder. The contract
// (server/request_builder.h): a request is built, or refused with recipe::ApiError (4xx). Anything
// else (another exception type, a sanitizer report, a stack overflow) is a finding.
#pragma once

#include "fuzz_support.h"
#include "server/request_builder.h"
#include "server/response_store.h"

namespace beluga::fuzz {

inline int fuzz_request(server::ServerApi api, const uint8_t* data, size_t size) {
  static server::ResponseStore* store = new server::ResponseStore(16);
  const DemoModel& m = demo_model();
  server::ModelInfo info;
  info.served_name = "demo";
  info.tokenizer = &m.tokenizer;
  info.encoder = &m.encoder;
  info.max_model_len = 4096;
  info.bos_token_id = 0;
  expect_only<recipe::ApiError>([&] {
    server::BuiltRequest b = server::build_request(api, as_text(data, size), info, {store, "tenant"});
    if (b.prompts.empty()) finding("a built request without a prompt");
    for (const auto& p : b.prompts)
      for (int id : p)
        if (id < 0 || size_t(id) >= m.tokenizer.vocab_size()) finding("a prompt token id out of range");
  });
  return 0;
}

}  // namespace beluga::fuzz
