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

class DemoModelTest : public ModelFixture {
 protected:
  void SetUp() override { load_fixture(kDemoModel, 1024); }
  static std::vector<int> prompt(int n, int seed) {
    std::vector<int> p{0};
    for (int i = 1; i < n; ++i) p.push_back(100 + (i * 37 + seed * 211) % 900);
    return p;
  }
};

}  // namespace beluga::engine_test
