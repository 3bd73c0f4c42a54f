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

// Speculation in the mode: verify rows are prefill-style rows, which the batch-invariant kernels
// compute as a decode row, so every draft accepted is plain decoding's token and the probe's ids are
// the ones it gets alone without speculation, whatever was drafted, gated or batched around it. MTP
// drafts on the demo model (fixed and confidence gating); prompt lookup on both models.
TEST_P(DeterministicTest, SpeculationGivesPlainDecodingsIds) {
  load(true);
  const bool mtp = model_->has_mtp();
  for (const char* cfg :
       {R"({"method":"mtp","num_speculative_tokens":2,"gating":"fixed"})",
        R"({"method":"mtp","num_speculative_tokens":3})",
        R"({"method":"ngram","num_speculative_tokens":2,"gating":"fixed","prompt_lookup_min":1})"}) {
    const SpecConfig spec = parse_spec_config(cfg);
    if (spec.method == SpecConfig::Method::kMtp && !mtp) continue;  // dsv2-lite-tiny has no MTP module
    SCOPED_TRACE(cfg);
    const int64_t before = prober_->draft_tokens();
    EXPECT_EQ(prober_->count_differing_runs(spec), 0);
    EXPECT_GT(prober_->draft_tokens(), before) << "the runs verified drafts";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, DeterministicTest,
                         ::testing::Values("models/beluga-demo-coder-mtp", "tests/fixtures/dsv2-lite-tiny"),
                         [](const auto& info) {
                           return info.param.find("demo") != std::string::npos ? std::string("DemoCoder")
                                                                               : std::string("Dsv2LiteTiny");
                         });

}  // namespace
}  // namespace beluga
