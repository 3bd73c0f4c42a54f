// The expert-parallel model tests' common driver: steps a model through prompts and decode steps
// and keeps every step's logits, so a group's run can be compared with one rank's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <vector>

#include "model/model.h"
#include "parallel/live_placement.h"

namespace beluga::test {

// Steps `prompts` (each in its own cache blocks) through a prefill and `decode` greedy-free steps
// that feed token 7 + step; returns every step's logits per sequence, [seq][step][vocab].
// `between`, if given, runs after every step (a test's way to make a background thread's timing
// deterministic).
inline std::vector<std::vector<std::vector<float>>> run_steps(Model& m,
                                                              const std::vector<std::vector<int>>& prompts,
                                                              int decode,
                                                              const std::function<void()>& between = {}) {
  const int V = m.config().vocab_size, S = int(prompts.size());
  KvCache kv = m.make_kv_cache(S);
  std::vector<std::vector<std::vector<float>>> out(static_cast<size_t>(S));
  std::vector<int> len(static_cast<size_t>(S), 0);
  for (int step = 0; step <= decode; ++step) {
    Batch b;
    for (int s = 0; s < S; ++s) {
      const std::vector<int> toks = step == 0 ? prompts[size_t(s)] : std::vector<int>{7 + step};
      b.seqs.push_back({len[size_t(s)], int(toks.size()), {s}});
      b.tokens.insert(b.tokens.end(), toks.begin(), toks.end());
      b.logit_rows.push_back(int(b.tokens.size()) - 1);
      len[size_t(s)] += int(toks.size());
    }
    std::vector<float> lg(size_t(S) * size_t(V));
    m.forward(b, kv, lg.data());
    for (int s = 0; s < S; ++s) out[size_t(s)].emplace_back(lg.begin() + s * V, lg.begin() + (s + 1) * V);
    if (between) between();
  }
  return out;
}

// Prompts of the given lengths, ids drawn uniformly from [2, vocab) with `seed`.
inline std::vector<std::vector<int>> random_prompts(int vocab, unsigned seed,
                                                    std::initializer_list<int> lengths) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> tok(2, vocab - 1);
  std::vector<std::vector<int>> prompts;
  for (int n : lengths) {
    prompts.emplace_back();
    for (int i = 0; i < n; ++i) prompts.back().push_back(tok(rng));
  }
  return prompts;
}

// Whether `a` equals the reference `b` within `rel` of b's largest magnitude (max |a - b| <= rel
// max |b|; the expert-parallel tests' tolerance for float rounding carried through the layers).
inline ::testing::AssertionResult logits_close(const std::vector<float>& a, const std::vector<float>& b,
                                               float rel = 1e-5f) {
  if (a.size() != b.size())
    return ::testing::AssertionFailure() << a.size() << " logits against " << b.size();
  float mx = 0, diff = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    mx = std::max(mx, std::fabs(b[i]));
    diff = std::max(diff, std::fabs(a[i] - b[i]));
  }
  if (diff <= rel * mx) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |diff| " << diff << " of max |logit| " << mx;
}

// The live-EPLB tests' placement over 2 ranks of `cfg` (experts loaded again from `src`): one
// redundant slot a rank, a plan every 2 closed steps over the last 4, prepared at the step boundary or
// (`background`) on its own thread.
inline std::unique_ptr<LiveExpertPlacement> frequent_eplb(const ModelConfig& cfg, WeightSource& src,
                                                          bool background) {
  LiveEplbOptions opt;
  opt.redundant_per_rank = 1;
  opt.interval_steps = 2;
  opt.window_steps = 4;
  opt.background = background;
  auto live =
      std::make_unique<LiveExpertPlacement>(deepseek_moe_layers(cfg, src), cfg.n_routed_experts, 2, opt);
  live->set_source(&src);
  return live;
}

}  // namespace beluga::test
