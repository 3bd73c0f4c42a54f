// The overlapped engine loop on CUDA (demo model, decode graphs, device sampler): steps launched before
// the step ahead of them is applied (EngineConfig::early_launch; the runner puts that step's sampled
// ids in) give the tokens of steps launched after it, in one mixed batch of greedy, seeded sampled
// (temperature, top_p, top_k), penalized rows (logit bias and repetition / presence / frequency
// penalties as logit edits) and constrained rows (a mask that depends on the last token, filled
// once the step ahead is applied). A gate request holds the engine while the others are submitted, so
// both runs schedule the same steps; the kernels are the same, so the tokens must be too (all but at
// most 2 of 32 requests identical, for the run-to-run reductions of the MoE combine).
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "../engine/engine_test_support.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_sample_rows.h"
#include "engine/engine.h"
#include "gpu_test_support.h"
#include "loader/weight_source.h"
#include "model/model.h"

namespace beluga {
namespace {

using namespace gpu_test;

// Allows the tokens t with (t + last accepted) % 3 == 0.
class ModThree final : public LogitsProcessor {
 public:
  void fill_mask(uint32_t* m, int vocab) override {
    for (int t = 0; t < vocab; ++t)
      if ((t + last_) % 3 == 0) m[t >> 5] |= 1u << (t & 31);
  }
  void accept(int token) override { last_ = token; }
  void rollback(int) override {}
  bool is_accepting() const override { return true; }

 private:
  int last_ = 0;
};

TEST(GpuEngineEarlyLaunch, SameTokensAsLaunchingAfterTheStepAhead) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  using engine_test::Collector;
  const std::string dir = source_dir() + "/models/beluga-demo-coder-mtp";
  const ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  Checkpoint ckpt(dir);
  CudaOps ops;
  auto model = load_model(cfg, ckpt, ops, 1024);
  model->set_sampler(std::make_unique<CudaSampleRows>(ops));
  using Tokens = std::map<std::string, std::map<int, std::vector<int>>>;
  constexpr int kReqs = 32;
  auto run = [&](bool early, EngineStats* st) {
    EngineConfig ec;
    ec.num_kv_blocks = 256;
    ec.max_num_seqs = 64;
    ec.max_model_len = 512;
    ec.early_launch = early;
    Collector c;
    engine_test::Gate gate;  // before the engine: its callback holds the gate
    Engine e(*model, ec);
    EngineRequest g;
    g.id = "gate";
    g.prompt = {0, 5, 6};
    g.sampling.temperature = 0;
    g.sampling.max_tokens = 1;
    g.on_output = gate.wrap(c.callback(), 60);
    EXPECT_EQ(e.submit(std::move(g)), SubmitStatus::kOk);
    EXPECT_TRUE(gate.wait_inside(60));
    for (int i = 0; i < kReqs; ++i) {
      EngineRequest r;
      r.id = "r";
      r.id += std::to_string(i);
      r.prompt = {0};
      for (int t = 1; t < 12 + 7 * i; ++t) r.prompt.push_back(100 + (t * 37 + i * 211) % 900);
      r.sampling.max_tokens = 40 + 3 * i;
      r.sampling.ignore_eos = true;
      r.sampling.seed = 7 + i;
      r.sampling.temperature = i % 4 == 0 ? 0.0f : 0.8f;
      r.sampling.top_p = i % 4 == 1 ? 0.9f : 1.0f;
      r.sampling.top_k = i % 4 == 2 ? 40 : 0;
      if (i % 3 == 0) r.logits_processor = [] { return std::make_unique<ModThree>(); };
      if (i % 5 == 4) {  // logit edits, counting the token the step ahead is still sampling
        r.sampling.repetition_penalty = 1.2f;
        r.sampling.presence_penalty = 0.6f;
        r.sampling.frequency_penalty = 0.4f;
        r.sampling.logit_bias = {{101, 2.0f}, {105, -50.0f}};
      }
      r.on_output = c.callback();
      EXPECT_EQ(e.submit(std::move(r)), SubmitStatus::kOk);
    }
    gate.release();
    EXPECT_TRUE(c.wait(kReqs + 1));
    for (int i = 0; i < 2000; ++i) {
      *st = e.stats();
      if (st->running == 0 && st->waiting == 0 && st->kv_blocks_used == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::lock_guard<std::mutex> lk(c.mu);
    EXPECT_TRUE(c.error.empty());
    return Tokens(c.tokens);
  };
  EngineStats after_st, early_st;
  const Tokens after = run(false, &after_st), early = run(true, &early_st);
  EXPECT_EQ(after_st.steps_early, 0);
  EXPECT_GT(early_st.steps_early, early_st.steps / 2) << "of " << early_st.steps << " steps";
  EXPECT_EQ(early_st.steps_early_retried, 0);
  int differ = 0;
  for (int i = 0; i < kReqs; ++i) {
    const std::string id = "r" + std::to_string(i);
    const std::vector<int>& x = after.at(id).at(0);
    const std::vector<int>& y = early.at(id).at(0);
    ASSERT_EQ(x.size(), size_t(40 + 3 * i)) << id;
    ASSERT_EQ(y.size(), x.size()) << id;
    differ += x != y;
    if (i % 3 == 0) {  // the masks held in both runs
      int last = 0;
      for (int t : y) {
        EXPECT_EQ((t + last) % 3, 0) << id;
        last = t;
      }
    }
  }
  EXPECT_LE(differ, 2) << "requests whose tokens differ";
  std::printf("early launch: %lld of %lld steps; %d of %d requests differ\n", (long long)early_st.steps_early,
              (long long)early_st.steps, differ, kReqs);
}

}  // namespace
}  // namespace beluga
