// Deterministic mode (EngineConfig::deterministic + CpuOptions::deterministic): one probe request gives
// bit-identical token ids and logprobs alone and inside batches of 1, 8 and 64 mixed requests, with
// chunked prefill (a small --max-num-batched-tokens) and with prefix-cache hits, greedy and sampled,
// on the demo model (MLA + MoE, BF16 weights) and the dsv2-lite-tiny fixture (MoE).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/cpu/cpu_ops.h"
#include "deterministic_harness.h"
#include "engine/engine.h"
#include "loader/weight_source.h"

namespace beluga {
namespace {

using namespace deterministic_test;

class DeterministicTest : public ::testing::TestWithParam<std::string> {
 protected:
  void load(bool deterministic) {
    const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/" + GetParam();
    cfg_ = ModelConfig::from_file(dir + "/config.json");
    ckpt_ = std::make_unique<Checkpoint>(dir);
    CpuOptions o;
    o.threads = 2;
    o.deterministic = deterministic;
    ops_ = std::make_unique<CpuOps>(o);
    model_ = load_model(cfg_, *ckpt_, *ops_, 1024);
    prober_ = std::make_unique<Prober>(*model_, cfg_.vocab_size, deterministic);
  }

  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<CpuOps> ops_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Prober> prober_;
};

TEST_P(DeterministicTest, SameIdsAndLogprobsAloneAndInMixedBatches) {
  load(true);
  EXPECT_EQ(prober_->count_differing_runs(), 0);
}

TEST_P(DeterministicTest, UnseededRequestsUseSeedZero) {
  load(true);
  const Probe probe{true, prober_->tokens(20, 3)};
  const Trace unseeded = prober_->run(probe, 0, 2048);
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  ec.deterministic = true;
  Engine engine(*model_, ec);
  Outputs out;
  EngineRequest r = prober_->request("probe", probe.prompt, true, 12, out);
  r.sampling.seed = 0;
  ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  ASSERT_TRUE(out.wait(1));
  std::lock_guard<std::mutex> lk(out.mu);
  EXPECT_EQ(out.seqs["probe"], unseeded);
}

TEST_P(DeterministicTest, SpeculativeDecodingIsRefused) {
  load(true);
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  ec.deterministic = true;
  ec.speculative.method = SpecConfig::Method::kMtp;
  ec.speculative.num_speculative_tokens = 1;
  EXPECT_THROW(Engine(*model_, ec), std::exception);
}

INSTANTIATE_TEST_SUITE_P(Models, DeterministicTest,
                         ::testing::Values("models/beluga-demo-coder-mtp", "tests/fixtures/dsv2-lite-tiny"),
                         [](const auto& info) {
                           return info.param.find("demo") != std::string::npos ? std::string("DemoCoder")
                                                                               : std::string("Dsv2LiteTiny");
                         });

}  // namespace
}  // namespace beluga
