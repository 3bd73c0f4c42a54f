// Expert parallelism of thread ranks on CUDA, two ranks on one GPU (each its own CudaOps and stream,
// exchanging through CudaOps::copy_between as --expert-parallel-size does on GPUs): prompt logits
// against one rank's on the same GPU (per-row rel L2: BF16 activations, routed sums in another order),
// greedy tokens equal while the reference margin is >= 0.5, and the peers' steps leave no error.
// Not part of ctest: tests/gpu/run.sh runs test_gpu on a machine with a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "engine/expert_parallel_peers.h"
#include "engine/generator.h"
#include "gpu_test_support.h"
#include "loader/safetensors.h"
#include "loader/weight_source.h"
#include "parallel/local_communicator.h"
#include "parallel/shard.h"

namespace beluga {
namespace {

using namespace gpu_test;

TEST(GpuExpertParallel, TwoRanksOnOneGpuMatchOneRank) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = source_dir() + "/tests/fixtures/dsv3-tiny";
  const ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  Checkpoint ckpt(dir);
  CudaOps single;
  auto one = load_model(cfg, ckpt, single, 1024);

  CudaOps rank0;
  std::vector<std::unique_ptr<Ops>> peer_ops;
  peer_ops.push_back(std::make_unique<CudaOps>());
  LocalTransport t;
  t.copy = &CudaOps::copy_between;
  t.ready = {[&] { rank0.synchronize(); }, [p = peer_ops[0].get()] { p->synchronize(); }};
  LocalGroup group(2, std::move(t));
  const ExpertSharding sharding = ExpertSharding::contiguous(cfg.n_routed_experts, 2);
  const ExpertParallelism ep{&group.communicator(0), &sharding, true};
  rank0.bind_thread();
  auto m0 = load_model(cfg, ckpt, rank0, 1024, &ep);
  ExpertParallelPeers peers(cfg, ckpt, m0->max_positions(), group, sharding, std::move(peer_ops));
  rank0.bind_thread();
  m0->set_step_peers(&peers);
  EXPECT_FALSE(m0->replays_graphs());  // the exchanges are planned on the host

  SafetensorsFile ref(dir + "/reference.safetensors");
  Generator g_one(*one), g_ep(*m0);
  const int V = cfg.vocab_size;
  for (int i = 0; ref.find("prompt_" + std::to_string(i)); ++i) {
    const std::string s = std::to_string(i);
    const TensorInfo& pi = ref.get("prompt_" + s);
    const int64_t* p64 = static_cast<const int64_t*>(pi.data);
    const std::vector<int> prompt(p64, p64 + pi.nbytes / 8);
    const std::vector<float> a = g_one.prompt_logits(prompt, MlaMode::kAbsorbed);
    const std::vector<float> b = g_ep.prompt_logits(prompt, MlaMode::kAbsorbed);
    ASSERT_EQ(a.size(), b.size());
    std::vector<double> err;
    for (size_t r = 0; r < prompt.size(); ++r)
      err.push_back(rel_l2(std::vector<float>(b.begin() + int64_t(r) * V, b.begin() + int64_t(r + 1) * V),
                           std::vector<float>(a.begin() + int64_t(r) * V, a.begin() + int64_t(r + 1) * V)));
    std::sort(err.begin(), err.end());
    const double median = err[err.size() / 2], worst = err.back();
    EXPECT_LE(median, 2e-2) << "prompt " << i;
    EXPECT_LE(worst, 0.5) << "prompt " << i;  // a near-tie may route a token to another expert
    std::printf("  EP2 on one GPU, prompt %d: rows %zu, rel L2 to one rank median %.5f max %.5f\n", i,
                err.size(), median, worst);
    GenerateParams gp;
    gp.max_tokens = 12;
    const auto want = g_one.generate({prompt}, gp)[0];
    const auto got = g_ep.generate({prompt}, gp)[0];
    const float* margin = static_cast<const float*>(ref.get("margin_" + s).data);
    for (size_t k = 0; k < got.size() && k < want.size() && margin[k] >= 0.5f; ++k)
      ASSERT_EQ(got[k], want[k]) << "prompt " << i << " step " << k;
  }
  EXPECT_FALSE(peers.failure());
  m0->set_step_peers(nullptr);
}

}  // namespace
}  // namespace beluga
