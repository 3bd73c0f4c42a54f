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

#include "../parallel/model_steps.h"
#include "engine/generator.h"
#include "engine/thread_rank_peers.h"
#include "gpu_test_support.h"
#include "loader/safetensors.h"
#include "loader/weight_source.h"
#include "parallel/live_placement.h"
#include "parallel/local_communicator.h"
#include "parallel/shard.h"

namespace beluga {
namespace {

using namespace gpu_test;

// Reference prompt i of a fixture's reference.safetensors (empty once there is none).
std::vector<int> reference_prompt(const SafetensorsFile& ref, int i) {
  const TensorInfo* t = ref.find("prompt_" + std::to_string(i));
  if (!t) return {};
  const int64_t* p = static_cast<const int64_t*>(t->data);
  return std::vector<int>(p, p + t->nbytes / 8);
}

// Two thread ranks' transport on GPUs (as the CLI builds it): device copies, each rank's queued work
// finished before its buffers are read.
LocalTransport two_rank_transport(Ops& rank0, Ops& rank1) {
  LocalTransport t;
  t.copy = &CudaOps::copy_between;
  t.ready = {[&rank0] { rank0.synchronize(); }, [&rank1] { rank1.synchronize(); }};
  return t;
}

// Each row's rel L2 of `got` [rows, V] against `want`.
std::vector<double> row_errors(const std::vector<float>& got, const std::vector<float>& want, int V) {
  std::vector<double> err;
  for (size_t r = 0; r < want.size() / size_t(V); ++r)
    err.push_back(
        rel_l2(std::vector<float>(got.begin() + int64_t(r) * V, got.begin() + int64_t(r + 1) * V),
               std::vector<float>(want.begin() + int64_t(r) * V, want.begin() + int64_t(r + 1) * V)));
  return err;
}

// An expert-parallel group of two thread ranks on one GPU, each with its own CudaOps and stream,
// exchanging through CudaOps::copy_between as --expert-parallel-size / --data-parallel-size do on GPUs:
// rank 0's model stepping the peer.
struct TwoRanksOnOneGpu {
  CudaOps rank0;
  std::unique_ptr<LocalGroup> group;
  ExpertSharding sharding;
  ExpertParallelism ep;
  std::unique_ptr<Model> m0;
  std::unique_ptr<ThreadRankPeers> peers;
  TwoRanksOnOneGpu(const ModelConfig& cfg, WeightSource& w, bool data_parallel)
      : sharding(ExpertSharding::contiguous(cfg.n_routed_experts, 2)) {
    std::vector<std::unique_ptr<Ops>> peer_ops;
    peer_ops.push_back(std::make_unique<CudaOps>());
    group = std::make_unique<LocalGroup>(2, two_rank_transport(rank0, *peer_ops[0]));
    ep = {&group->communicator(0), &sharding, !data_parallel};
    rank0.bind_thread();
    m0 = load_model(cfg, w, rank0, 1024, &ep);
    peers =
        std::make_unique<ThreadRankPeers>(cfg, w, m0->max_positions(), *group, sharding, std::move(peer_ops),
                                          nullptr, InjectedRankFault{}, data_parallel);
    rank0.bind_thread();
    m0->set_step_peers(peers.get());
  }
  ~TwoRanksOnOneGpu() { m0->set_step_peers(nullptr); }
};

// dsv3-tiny, and one model of it on the GPU: what both tests compare against.
class GpuExpertParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    single = std::make_unique<CudaOps>();
    one = load_model(cfg, ckpt, *single, 1024);
  }
  const std::string dir = source_dir() + "/tests/fixtures/dsv3-tiny";
  const ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  Checkpoint ckpt{dir};
  std::unique_ptr<CudaOps> single;
  std::unique_ptr<Model> one;
};

TEST_F(GpuExpertParallel, TwoRanksOnOneGpuMatchOneRank) {
  TwoRanksOnOneGpu two(cfg, ckpt, false);
  Model* m0 = two.m0.get();
  ThreadRankPeers& peers = *two.peers;
  EXPECT_FALSE(m0->replays_graphs());  // the exchanges are planned on the host

  SafetensorsFile ref(dir + "/reference.safetensors");
  Generator g_one(*one), g_ep(*m0);
  const int V = cfg.vocab_size;
  for (int i = 0; ref.find("prompt_" + std::to_string(i)); ++i) {
    const std::string s = std::to_string(i);
    const std::vector<int> prompt = reference_prompt(ref, i);
    const std::vector<float> a = g_one.prompt_logits(prompt, MlaMode::kAbsorbed);
    const std::vector<float> b = g_ep.prompt_logits(prompt, MlaMode::kAbsorbed);
    ASSERT_EQ(a.size(), b.size());
    std::vector<double> err = row_errors(b, a, V);
    const size_t worst_row = size_t(std::max_element(err.begin(), err.end()) - err.begin());
    // A near-tie in a BF16 router may send a row's token to another expert (H100 run of session 37:
    // one row of the 300-token prompt, rel L2 0.98; on the CPU in F32 every row of every prompt is
    // within 1e-6 of one rank, ExpertParallelGolden): a few such rows, not more.
    const size_t off = size_t(std::count_if(err.begin(), err.end(), [](double e) { return e > 0.1; }));
    EXPECT_LE(off, std::max<size_t>(1, err.size() / 100)) << "prompt " << i;
    std::sort(err.begin(), err.end());
    const double median = err[err.size() / 2], worst = err.back();
    EXPECT_LE(median, 2e-2) << "prompt " << i;
    std::printf("  (rows off by > 0.1: %zu; the worst is row %zu)\n", off, worst_row);
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
}

// Attention data parallel on two ranks of one GPU (--data-parallel-size 2 on a GPU): each rank steps
// only its own sequences in its own cache (block ids of its range), the other serving its expert rows
// (an idle rank in the decode steps where it has none); every step's last-row logits against one
// model holding every sequence in one cache.
TEST_F(GpuExpertParallel, TwoDataParallelRanksOnOneGpuMatchOneModel) {
  TwoRanksOnOneGpu two(cfg, ckpt, true);
  CudaOps& rank0 = two.rank0;
  Model* m0 = two.m0.get();
  ThreadRankPeers& peers = *two.peers;

  const int P = 16, V = cfg.vocab_size;  // blocks a rank
  const std::vector<int> lens = {5, 70, 1, 33, 12};
  // Sequence s on rank s % 2 at 4 blocks of its own; steps: the prompts, then all, then rank 1's only
  // (rank 0 idle), then rank 0's only.
  std::vector<std::vector<int>> plans = {{0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {1, 3}, {0, 2, 4}};
  KvCache kv_one = one->make_kv_cache(2 * P), kv0 = m0->make_kv_cache(P);
  std::vector<int> len(lens.size(), 0);
  single->bind_thread();
  for (size_t step = 0; step < plans.size(); ++step) {
    Batch b;
    for (int s : plans[step]) {
      std::vector<int> toks;
      const int q = step == 0 ? lens[size_t(s)] : 1;
      for (int i = 0; i < q; ++i) toks.push_back(2 + (s * 977 + int(step) * 131 + i * 31) % (V - 2));
      std::vector<int> table;
      for (int k = 0; k < 4; ++k) table.push_back((s % 2) * P + (s / 2) * 4 + k);
      b.seqs.push_back({len[size_t(s)], q, table});
      b.tokens.insert(b.tokens.end(), toks.begin(), toks.end());
      b.logit_rows.push_back(int(b.tokens.size()) - 1);
      len[size_t(s)] += q;
    }
    const size_t R = b.logit_rows.size();
    std::vector<float> want(R * size_t(V)), got(R * size_t(V));
    single->bind_thread();
    one->forward(b, kv_one, want.data());
    rank0.bind_thread();
    m0->forward(b, kv0, got.data());
    for (size_t r = 0; r < R; ++r) {
      const double e =
          rel_l2(std::vector<float>(got.begin() + int64_t(r) * V, got.begin() + int64_t(r + 1) * V),
                 std::vector<float>(want.begin() + int64_t(r) * V, want.begin() + int64_t(r + 1) * V));
      EXPECT_LE(e, 5e-2) << "step " << step << " row " << r;
    }
  }
  EXPECT_FALSE(peers.failure());
}

// Live EPLB on two expert-parallel ranks of one GPU (`--expert-parallel-size 2 --eplb` on a GPU): a plan
// every 2 steps over the last 4, one redundant slot a rank, prepared at the boundary and on a
// background thread; the moved experts are uploaded into memory of their own (Ops::upload_owned) and
// the old ones freed with the placement that held them. Every step's logits against one model's on
// the GPU, through the rebalances.
TEST_F(GpuExpertParallel, LiveEplbMovesExpertsOnTheGpuAndMatchesOneModel) {
  const std::string dir2 = source_dir() + "/tests/fixtures/dsv2-lite-tiny";
  const ModelConfig cfg2 = ModelConfig::from_file(dir2 + "/config.json");
  Checkpoint ckpt2{dir2};
  single->bind_thread();
  const auto one2 = load_model(cfg2, ckpt2, *single, 256);
  const auto prompts = test::random_prompts(cfg2.vocab_size, 5, {5, 17, 1, 9, 12, 3, 30, 2});
  const auto want = test::run_steps(*one2, prompts, 12);
  for (bool background : {false, true}) {
    const auto live_ptr = test::frequent_eplb(cfg2, ckpt2, background);
    LiveExpertPlacement& live = *live_ptr;
    CudaOps rank0;
    std::vector<std::unique_ptr<Ops>> peer_ops;
    peer_ops.push_back(std::make_unique<CudaOps>());
    LocalGroup group(2, two_rank_transport(rank0, *peer_ops[0]));
    const ExpertSharding sharding = live.initial_sharding();
    const ExpertParallelism ep{&group.communicator(0), &sharding, true, &live};
    rank0.bind_thread();
    auto m0 = load_model(cfg2, ckpt2, rank0, 256, &ep);
    ThreadRankPeers peers(cfg2, ckpt2, m0->max_positions(), group, sharding, std::move(peer_ops), &live);
    rank0.bind_thread();
    m0->set_step_peers(&peers);
    const auto got = test::run_steps(*m0, prompts, 12, [&] {
      if (background) live.join();
    });
    m0->set_step_peers(nullptr);
    live.join();
    EXPECT_EQ(live.rebalances() + live.skipped(), 6) << "background " << background;
    EXPECT_GT(live.moved_slots_total(), 0) << "background " << background;
    int off = 0;
    double worst = 0;
    for (size_t s = 0; s < prompts.size(); ++s)
      for (size_t step = 0; step < want[s].size(); ++step) {
        const double e = rel_l2(got[s][step], want[s][step]);
        worst = std::max(worst, e);
        off += e > 0.1;
        EXPECT_LE(e, 0.5) << "background " << background << " sequence " << s << " step " << step;
      }
    EXPECT_LE(off, 2) << "background " << background << ": rows off by > 0.1 (a BF16 router's near-ties)";
    std::printf(
        "  EP2 + live EPLB on one GPU (background %d): %lld rebalances, %lld slots moved, %d of %zu "
        "rows off by > 0.1, worst rel L2 %.5f\n",
        int(background), (long long)live.rebalances(), (long long)live.moved_slots_total(), off,
        prompts.size() * want[0].size(), worst);
  }
}

// Tensor parallel on two ranks of one GPU (`--tensor-parallel-size 2` on a GPU): qwen3-tiny's heads
// and MLP split, each rank's partial o and down products summed through the device-copy transport
// (BF16 activations summed in F32); every prompt's logits against one model on the GPU, and greedy
// tokens where the reference's margin is clear.
TEST(GpuTensorParallel, TwoRanksOnOneGpuMatchOneModel) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  const std::string dir = source_dir() + "/tests/fixtures/qwen3-tiny";
  const ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  Checkpoint ckpt{dir};
  CudaOps single;
  const auto one = load_model(cfg, ckpt, single, 1024);
  CudaOps rank0;
  std::vector<std::unique_ptr<Ops>> peer_ops;
  peer_ops.push_back(std::make_unique<CudaOps>());
  LocalGroup group(2, two_rank_transport(rank0, *peer_ops[0]));
  auto load = [&](int r, Ops& o) {
    const TensorParallelism tp{&group.communicator(r)};
    return load_model(cfg, ckpt, o, 1024, nullptr, &tp);
  };
  rank0.bind_thread();
  auto m0 = load(0, rank0);
  ThreadRankPeers peers(group, std::move(peer_ops), load, RankSplit::kTensorShardedCache);
  rank0.bind_thread();
  m0->set_step_peers(&peers);
  EXPECT_FALSE(m0->replays_graphs());

  SafetensorsFile ref(dir + "/reference.safetensors");
  const int V = cfg.vocab_size;
  for (int i = 0; ref.find("prompt_" + std::to_string(i)); ++i) {
    const std::string s = std::to_string(i);
    const std::vector<int> prompt = reference_prompt(ref, i);
    single.bind_thread();
    Generator g_one(*one);
    const std::vector<float> a = g_one.prompt_logits(prompt);
    GenerateParams gp;
    gp.max_tokens = 12;
    const auto want = g_one.generate({prompt}, gp)[0];
    rank0.bind_thread();
    Generator g_tp(*m0);
    const std::vector<float> b = g_tp.prompt_logits(prompt);
    const auto got = g_tp.generate({prompt}, gp)[0];
    ASSERT_EQ(a.size(), b.size());
    const std::vector<double> err = row_errors(b, a, V);
    const double worst = *std::max_element(err.begin(), err.end());
    EXPECT_LE(worst, 2e-2) << "prompt " << i;
    std::printf("  TP2 on one GPU, prompt %d: rows %zu, rel L2 to one model max %.5f\n", i, prompt.size(),
                worst);
    const float* margin = static_cast<const float*>(ref.get("margin_" + s).data);
    for (size_t k = 0; k < got.size() && k < want.size() && margin[k] >= 0.5f; ++k)
      ASSERT_EQ(got[k], want[k]) << "prompt " << i << " step " << k;
  }
  EXPECT_FALSE(peers.failure());
  m0->set_step_peers(nullptr);
}

}  // namespace
}  // namespace beluga
