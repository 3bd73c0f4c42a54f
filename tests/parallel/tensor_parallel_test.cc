// Tensor parallelism's pieces (parallel/tensor_parallel.h), the split it refuses
// (tensor_parallel_refusal), the size a group restarts with (tensor_parallel_restart_size), and a
// split model's logits against one model's, steps and decode included (qwen3-tiny over 2 CPU ranks;
// tests/golden holds the check against transformers).
#include "parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "../common/tensor_parallel_pair.h"
#include "backend/cpu/cpu_ops.h"
#include "model_steps.h"
#include "run_ranks.h"
#include "util/error.h"

namespace beluga {
namespace {

TEST(TensorPart, SplitsEvenlyAndRefusesAnUnevenSplit) {
  EXPECT_EQ(tensor_part(12, 0, 3).begin, 0);
  EXPECT_EQ(tensor_part(12, 2, 3).begin, 8);
  EXPECT_EQ(tensor_part(12, 2, 3).end, 12);
  EXPECT_THROW(tensor_part(10, 0, 3), Error);
  EXPECT_THROW(tensor_part(12, 3, 3), Error);
}

// A [4, 6] tensor valued 10 r + c: rows are views of it, columns copies.
TEST(TensorPart, HostSlicesTakeRowsAndColumns) {
  std::vector<float> v(24);
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 6; ++c) v[size_t(r * 6 + c)] = float(10 * r + c);
  const Tensor t = Tensor::make(v.data(), DType::kF32, {4, 6});
  std::vector<std::byte> buf;
  const Tensor rows = host_slice(t, 0, 1, 2, buf);
  ASSERT_EQ(rows.shape[0], 2);
  EXPECT_EQ(rows.ptr<float>(), v.data() + 12) << "a row part is a view";
  const Tensor cols = host_slice(t, 1, 2, 3, buf);
  ASSERT_EQ(cols.shape[0], 4);
  ASSERT_EQ(cols.shape[1], 2);
  ASSERT_TRUE(cols.is_contiguous());
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 2; ++c) EXPECT_EQ(cols.ptr<float>()[r * 2 + c], float(10 * r + 4 + c));
  // FP8 parts fall on whole scale blocks: 6 columns in blocks of 3 split in 2, not in 3.
  EXPECT_NO_THROW(host_slice(t, 1, 1, 2, buf, 3));
  EXPECT_THROW(host_slice(t, 1, 1, 3, buf, 3), Error);
  // The scale tensor's part: weight columns [3, 6) of 6 in blocks of 3 are scale column 1.
  std::vector<float> s = {1, 2, 3, 4};  // [2, 2]
  const Tensor sc = scale_slice(Tensor::make(s.data(), DType::kF32, {2, 2}), 1, 6, 1, 2, 3, buf);
  ASSERT_EQ(sc.shape[1], 1);
  EXPECT_EQ(sc.ptr<float>()[0], 2);
  EXPECT_EQ(sc.ptr<float>()[1], 4);
}

// Every rank gets the same sum of the ranks' tensors.
TEST(TensorPart, AllReduceSumsOverTheRanks) {
  test::run_ranks(3, [](Communicator& c) {
    CpuOps ops(CpuOptions{1});
    std::vector<float> v = {float(c.rank()), 1.0f, 0.5f * float(c.rank() + 1), -2.0f};
    all_reduce_sum(ops, c, Tensor::make(v.data(), DType::kF32, {2, 2}));
    EXPECT_EQ(v, (std::vector<float>{3.0f, 3.0f, 3.0f, -6.0f})) << "rank " << c.rank();
  });
}

TEST(TensorParallelRefusal, NamesWhatDoesNotSplit) {
  const std::string fx = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/";
  const ModelConfig qwen = ModelConfig::from_file(fx + "qwen3-tiny/config.json");  // 4 heads, 2 KV heads
  EXPECT_EQ(tensor_parallel_refusal(qwen, 1), "");
  EXPECT_EQ(tensor_parallel_refusal(qwen, 2), "");
  EXPECT_NE(tensor_parallel_refusal(qwen, 4).find("KV heads (2)"), std::string::npos);
  EXPECT_NE(tensor_parallel_refusal(qwen, 3).find("attention heads (4)"), std::string::npos);
  // DeepSeek: the query heads and the dense MLP split, the latent does not (no KV-head condition);
  // the routed experts split over the same ranks.
  const ModelConfig ds = ModelConfig::from_file(fx + "dsv3-tiny/config.json");
  EXPECT_EQ(tensor_parallel_refusal(ds, 2), "");
  EXPECT_EQ(tensor_parallel_refusal(ds, 4), "");
  EXPECT_NE(tensor_parallel_refusal(ds, 3).find("attention heads (4)"), std::string::npos);
  ModelConfig few = ds;
  few.n_routed_experts = 1;
  EXPECT_NE(tensor_parallel_refusal(few, 2).find("routed experts"), std::string::npos);
  const ModelConfig v4 = ModelConfig::from_file(fx + "dsv4-tiny/config.json");
  EXPECT_NE(tensor_parallel_refusal(v4, 2).find("DeepSeek-V4"), std::string::npos);
  // An FP8 checkpoint's parts must fall on its 128-wide scale blocks: dsv3-tiny-fp8's 4 heads of 48
  // query rows split in two do not.
  {
    const std::string dir = fx + "dsv3-tiny-fp8";
    const ModelConfig f8 = ModelConfig::from_file(dir + "/config.json");
    Checkpoint ckpt(dir);
    test::TensorParallelGroup* none = nullptr;
    EXPECT_THROW(none = new test::TensorParallelGroup(f8, ckpt, 256), Error);
    delete none;
  }
  CpuOps ops(CpuOptions{1});
  DummyWeights w;
  LocalGroup g(4);
  const TensorParallelism tp{&g.communicator(0)};
  EXPECT_THROW(load_model(qwen, w, ops, 256, nullptr, &tp), Error);
}

// A rank's part of one linear among others a loader stacks: rows [r out / N, ...) of that linear,
// its bias likewise; every other tensor as the source has it.
TEST(TensorPart, RowPartSourceHandsOutOneLinearsRows) {
  DummyWeights w;
  const Tensor full = w.get("l.q.weight", {8, 4}, DType::kBF16);
  const Tensor other = w.get("l.k.weight", {8, 4}, DType::kBF16);
  RowPartSource part(w, "l.q", 8, 1, 2, 128);
  const Tensor q = part.get("l.q.weight", {4, 4});
  ASSERT_EQ(q.shape[0], 4);
  EXPECT_EQ(q.data, full.rows(4, 8).data);
  EXPECT_EQ(part.get("l.k.weight", {8, 4}).data, other.data);
  EXPECT_TRUE(part.find("l.q.bias", {4}).empty()) << "the dummy source has no biases";
}

// The size a group restarts with is the largest the model still splits over (tensor_parallel_refusal).
TEST(TensorParallelRestart, TheLargestSizeThatDividesEverySplit) {
  ModelConfig c =
      ModelConfig::from_file(std::string(BELUGA_SOURCE_DIR) + "/bench/configs/llama-3-8b-shape/config.json");
  ASSERT_EQ(c.num_heads, 32);
  ASSERT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(tensor_parallel_restart_size(c, 3), 2);
  EXPECT_EQ(tensor_parallel_restart_size(c, 7), 4);
  EXPECT_EQ(tensor_parallel_restart_size(c, 1), 1);
  EXPECT_EQ(tensor_parallel_restart_size(c, 0), 0);
  c.num_heads = 12;
  c.num_kv_heads = 6;
  c.intermediate_size = 30;
  EXPECT_EQ(tensor_parallel_restart_size(c, 5), 3);
  // DeepSeek: only the query heads and the dense layers split (the latent does not).
  const ModelConfig ds =
      ModelConfig::from_file(std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv3-tiny/config.json");
  EXPECT_EQ(tensor_parallel_restart_size(ds, 3), 2);
}

// Prompts of several lengths (each within its one cache block) and 6 decode steps: the split model's
// logits at every step equal one model's up to float rounding (the ranks' partial products are
// summed in another order than one GEMM's), and a rank's cache entry is half one model's (its own KV
// heads' K and V).
TEST(TensorParallelModel, TwoRanksLogitsEqualOneModel) {
  const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/qwen3-tiny";
  const ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  Checkpoint ckpt(dir);
  CpuOps ops(CpuOptions{1});
  const auto one = load_model(cfg, ckpt, ops, 512);
  const auto prompts = test::random_prompts(cfg.vocab_size, 3, {1, 12, 50, 5});
  const auto want = test::run_steps(*one, prompts, 6);
  test::TensorParallelGroup tp(cfg, ckpt, 512);
  const auto got = test::run_steps(*tp.model, prompts, 6);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s)
    for (size_t step = 0; step < want[s].size(); ++step)
      EXPECT_TRUE(test::logits_close(got[s][step], want[s][step])) << "sequence " << s << " step " << step;
  const KvCache mine = tp.model->make_kv_cache(1);
  EXPECT_EQ(mine.layers[0].shape[2], cfg.kv_entry_dim() / 2);
}

}  // namespace
}  // namespace beluga
