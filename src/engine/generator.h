// Generator: runs one or more sequences to completion on a Model, without a scheduler: prefill the
// prompts (in chunks), then decode all of them together, one token per sequence per step, through the
// paged KV cache. The building block of `beluga generate` and `beluga bench model`.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "model/model.h"

namespace beluga {

struct GenerateParams {
  int max_tokens = 16;
  float temperature = 0.0f;  // 0: greedy
  uint64_t seed = 0;
  int prefill_chunk = 0;  // 0: whole prompt in one step
  std::vector<int> stop_ids;
  MlaMode mla_mode = MlaMode::kAuto;
};

struct StepTiming {
  bool prefill;
  int tokens;
  double seconds;
};

class Generator {
 public:
  explicit Generator(Model& model) : model_(model) {}

  // Generates for each prompt; returns the new tokens of each. `on_step` sees each step's timing.
  std::vector<std::vector<int>> generate(const std::vector<std::vector<int>>& prompts,
                                         const GenerateParams& p,
                                         const std::function<void(const StepTiming&)>& on_step = {});

  // Logits [n_prompt, vocab] for every prompt position from one prefill pass.
  std::vector<float> prompt_logits(const std::vector<int>& prompt, MlaMode mode = MlaMode::kAuto,
                                   std::vector<std::vector<float>>* hidden_capture = nullptr);

 private:
  Model& model_;
};

}  // namespace beluga
