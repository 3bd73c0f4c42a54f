// Whole-model expert parallelism on the CPU: dsv2-lite-tiny with EP=2 and EP=4 (thread ranks, each
// with its own backend, KV cache and sequences: attention data parallel) gives the logits of EP=1
// (one model, all sequences in one batch), over a prefill step and two decode steps. Tolerance:
// max |ep - ref| <= 1e-5 * max |ref| over each sequence's logits (the MoE layers' float rounding,
// expert_parallel_test.cc, carried through the layers; observed: 3e-7 of max |ref|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/model.h"
#include "model_steps.h"
#include "run_ranks.h"

namespace beluga {
namespace {

const std::string kDir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv2-lite-tiny";

TEST(ModelExpertParallel, Dsv2LiteTinyLogitsEqualOneRank) {
  const ModelConfig cfg = ModelConfig::from_file(kDir + "/config.json");
  Checkpoint ckpt(kDir);
  const auto prompts = test::random_prompts(cfg.vocab_size, 5, {5, 17, 1, 9, 12, 3, 30, 2});
  CpuOps ref_ops(CpuOptions{1});
  auto ref_model = load_model(cfg, ckpt, ref_ops, 256);
  const auto ref = test::run_steps(*ref_model, prompts, 2);

  for (int n : {2, 4}) {
    const ExpertSharding sharding = ExpertSharding::contiguous(cfg.n_routed_experts, n);
    std::vector<std::vector<std::vector<float>>> got(prompts.size());
    std::vector<int64_t> params(static_cast<size_t>(n));
    test::run_ranks(n, [&](Communicator& comm) {
      const int r = comm.rank();
      CpuOps ops(CpuOptions{1});
      const ExpertParallelism ep{&comm, &sharding};
      auto model = load_model(cfg, ckpt, ops, 256, &ep);
      params[size_t(r)] = model->num_parameters();
      std::vector<std::vector<int>> mine;  // sequences r, r + n, ...
      for (size_t s = size_t(r); s < prompts.size(); s += size_t(n)) mine.push_back(prompts[s]);
      const auto out = test::run_steps(*model, mine, 2);
      for (size_t i = 0; i < out.size(); ++i) got[size_t(r) + i * size_t(n)] = out[i];
    });
    // Each rank holds the shared weights and its share of the routed experts.
    EXPECT_LT(params[0], ref_model->num_parameters());
    for (size_t s = 0; s < prompts.size(); ++s)
      for (size_t step = 0; step < ref[s].size(); ++step) {
        const auto& a = got[s][step];
        const auto& b = ref[s][step];
        EXPECT_TRUE(test::logits_close(a, b)) << "EP=" << n << " sequence " << s << " step " << step;
        EXPECT_EQ(std::max_element(a.begin(), a.end()) - a.begin(),
                  std::max_element(b.begin(), b.end()) - b.begin());
      }
  }
}

// Replicated tokens: every rank steps every sequence (its own KV cache); each rank's logits equal EP=1.
TEST(ModelExpertParallel, ReplicatedTokensGiveEveryRankTheLogitsOfOneRank) {
  const ModelConfig cfg = ModelConfig::from_file(kDir + "/config.json");
  Checkpoint ckpt(kDir);
  const std::vector<std::vector<int>> prompts = {
      {5, 9, 200, 31, 7}, {1000}, {44, 45, 46, 47, 48, 49, 50, 51, 52}};
  CpuOps ref_ops(CpuOptions{1});
  auto ref_model = load_model(cfg, ckpt, ref_ops, 256);
  const auto ref = test::run_steps(*ref_model, prompts, 2);
  for (int n : {2, 4}) {
    const ExpertSharding sharding = ExpertSharding::contiguous(cfg.n_routed_experts, n);
    std::vector<std::vector<std::vector<std::vector<float>>>> got(static_cast<size_t>(n));
    test::run_ranks(n, [&](Communicator& comm) {
      CpuOps ops(CpuOptions{1});
      const ExpertParallelism ep{&comm, &sharding, /*replicated_tokens=*/true};
      auto model = load_model(cfg, ckpt, ops, 256, &ep);
      got[size_t(comm.rank())] = test::run_steps(*model, prompts, 2);
    });
    for (int r = 0; r < n; ++r)
      for (size_t s = 0; s < prompts.size(); ++s)
        for (size_t step = 0; step < ref[s].size(); ++step)
          EXPECT_TRUE(test::logits_close(got[size_t(r)][s][step], ref[s][step]))
              << "EP=" << n << " rank " << r << " sequence " << s << " step " << step;
  }
}

TEST(ModelExpertParallel, RefusesAShardingOfAnotherExpertCount) {
  const ModelConfig cfg = ModelConfig::from_file(kDir + "/config.json");
  Checkpoint ckpt(kDir);
  const ExpertSharding sharding = ExpertSharding::contiguous(cfg.n_routed_experts + 2, 1);
  LocalGroup group(1);
  CpuOps ops(CpuOptions{1});
  const ExpertParallelism ep{&group.communicator(0), &sharding};
  EXPECT_THROW(load_model(cfg, ckpt, ops, 256, &ep), Error);
}

}  // namespace
}  // namespace beluga
