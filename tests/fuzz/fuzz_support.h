// Shared by the libFuzzer targets (one target per file in this folder): the built-in model's
// tokenizer and chat encoder, loaded once per process, and the rule every target checks — an input
// may be refused only with the error type its contract names; anything else aborts, so libFuzzer
// reports it as a crash with the input that caused it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "recipe/chat_format.h"
#include "tokenizer/tokenizer.h"

namespace beluga::fuzz {

inline const std::string kDemoModelDir = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";

struct DemoModel {
  tok::Tokenizer tokenizer;
  recipe::ChatEncoder encoder;
};

// Loaded on first use, kept for the process (libFuzzer runs every input in one process).
inline const DemoModel& demo_model() {
  static const DemoModel* m = new DemoModel{tok::Tokenizer::from_file(kDemoModelDir + "/tokenizer.json"),
                                            recipe::ChatEncoder::from_model_dir(kDemoModelDir)};
  return *m;
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A finding: prints what broke and aborts (libFuzzer saves the input as crash-*).
[[noreturn]] inline void finding(const char* what, const char* detail = "") {
  std::fprintf(stderr, "fuzz finding: %s %s\n", what, detail);
  std::abort();
}

// Runs `f`; an exception of type `Allowed` is a refused input, any other exception a finding.
template <typename Allowed, typename F>
void expect_only(F&& f) {
  try {
    f();
  } catch (const Allowed&) {
  } catch (const std::exception& e) {
    finding("unexpected exception:", e.what());
  }
}

// Deterministic split points from the input itself (so a crash reproduces from its file alone).
struct Splitter {
  uint64_t state;
  explicit Splitter(std::string_view s) : state(0x9e3779b97f4a7c15ull ^ s.size()) {
    for (unsigned char c : s) state = (state ^ c) * 0x100000001b3ull;
  }
  size_t next(size_t bound) {  // in [1, bound]
    state ^= state >> 33;
    state *= 0xff51afd7ed558ccdull;
    state ^= state >> 33;
    return bound == 0 ? 0 : 1 + state % bound;
  }
};

}  // namespace beluga::fuzz
