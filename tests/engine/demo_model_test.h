// A test fixture with the built-in demo model (MLA + MoE + an MTP module) loaded on the CPU backend,
// shared by the speculative-decoding tests (tests/engine, tests/kvstore): Python-ish prompts the model
// continues with code, so that its drafts are often right, and greedy requests into a Collector.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "engine/engine.h"
#include "engine_test_support.h"
#include "loader/weight_source.h"

namespace beluga::engine_test {

inline const std::string kDemoModel = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";

class DemoModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cfg_ = ModelConfig::from_file(kDemoModel + "/config.json");
    ckpt_ = std::make_unique<Checkpoint>(kDemoModel);
    ops_ = std::make_unique<CpuOps>(CpuOptions{2});
    model_ = load_model(cfg_, *ckpt_, *ops_, 1024);
  }
  static std::vector<int> prompt(int n, int seed) {
    std::vector<int> p{0};
    for (int i = 1; i < n; ++i) p.push_back(100 + (i * 37 + seed * 211) % 900);
    return p;
  }
  static EngineRequest greedy(const std::string& id, std::vector<int> p, int max_tokens, Collector& c,
                              int n = 1) {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(p);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.sampling.n = n;
    r.on_output = c.callback();
    return r;
  }

  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<CpuOps> ops_;
  std::unique_ptr<Model> model_;
};

}  // namespace beluga::engine_test
