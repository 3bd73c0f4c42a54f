// The CUDA backend's batched KV block copies (kv_host_copy.cu) against one copy per layer and block
// (the path they replace): bit-exact both ways, to pinned host slots in a shuffled order (runs of
// adjacent slots and single ones) and to pageable memory; and their bandwidth beside the old path's
// and a pinned cudaMemcpy of the same bytes, printed as "[figures] kv host copy ..." lines.
// DeepSeek-V2-Lite's shape: 27 layers, 64-token blocks of 576 BF16 values per token (72 KiB slices).
// Not part of ctest: tests/gpu/run.sh runs it (--gtest_filter=KvHostCopy.*).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "backend/cuda/cuda_ops.h"

namespace beluga {
namespace {

constexpr int kLayers = 27, kBlocks = 512, kTokens = 64, kWidth = 576, kCopies = 128;
constexpr size_t kRow = size_t(kTokens) * kWidth * 2;  // one block's slice of a layer
constexpr size_t kBlockBytes = kRow * kLayers;

class KvHostCopy : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    ops = std::make_unique<CudaOps>();
    std::mt19937_64 g(5);
    std::vector<uint64_t> bytes(kBlocks * kRow / 8);
    for (int l = 0; l < kLayers; ++l) {
      layers.push_back(ops->alloc_persistent(DType::kBF16, {kBlocks, kTokens, kWidth}));
      for (auto& x : bytes) x = g();
      ASSERT_EQ(cudaMemcpy(layers.back().data, bytes.data(), kBlocks * kRow, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    std::vector<int> all(kBlocks);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), g);
    blocks.assign(all.begin(), all.begin() + kCopies);
    // Host slots: the first half in runs of adjacent slots, the rest shuffled.
    slots.resize(kCopies);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin() + kCopies / 2, slots.end(), g);
    pinned = static_cast<std::byte*>(ops->host_alloc(kCopies * kBlockBytes));
    ASSERT_NE(pinned, nullptr);
  }
  void TearDown() override {
    if (ops) ops->host_free(pinned);
  }
  std::vector<KvBlockCopy> copies(std::byte* base) const {
    std::vector<KvBlockCopy> c;
    for (int i = 0; i < kCopies; ++i)
      c.push_back({blocks[size_t(i)], base + size_t(slots[size_t(i)]) * kBlockBytes});
    return c;
  }
  // The path replaced: one copy per layer and block.
  void per_layer_to_host(const std::vector<KvBlockCopy>& c, cudaStream_t st) const {
    for (const KvBlockCopy& x : c)
      for (int l = 0; l < kLayers; ++l)
        ASSERT_EQ(cudaMemcpyAsync(x.host + size_t(l) * kRow,
                                  static_cast<char*>(layers[size_t(l)].data) + size_t(x.block) * kRow, kRow,
                                  cudaMemcpyDeviceToHost, st),
                  cudaSuccess);
  }
  std::vector<std::byte> reference() const {
    std::vector<std::byte> ref(kCopies * kBlockBytes);
    per_layer_to_host(copies(ref.data()), nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return ref;
  }

  std::unique_ptr<CudaOps> ops;
  std::vector<Tensor> layers;
  std::vector<int> blocks, slots;
  std::byte* pinned = nullptr;
};

TEST_F(KvHostCopy, BatchedCopiesAreBitExactBothWays) {
  const std::vector<std::byte> ref = reference();
  std::memset(pinned, 0xee, kCopies * kBlockBytes);
  ops->kv_blocks_to_host(layers, copies(pinned));
  ops->synchronize();
  ASSERT_EQ(std::memcmp(pinned, ref.data(), ref.size()), 0) << "to pinned host slots";
  std::vector<std::byte> pageable(ref.size(), std::byte{0x11});
  ops->kv_blocks_to_host(layers, copies(pageable.data()));
  ops->synchronize();
  ASSERT_EQ(pageable, ref) << "to pageable memory";
  // Back: each image to another block (the blocks in reverse order), then read per layer.
  std::vector<KvBlockCopy> back = copies(pinned);
  for (int i = 0; i < kCopies; ++i) back[size_t(i)].block = blocks[size_t(kCopies - 1 - i)];
  ops->kv_blocks_from_host(layers, back);
  ops->synchronize();
  std::vector<std::byte> again(ref.size());
  std::vector<KvBlockCopy> check = back;
  for (auto& c : check) c.host = again.data() + size_t(c.host - pinned);
  per_layer_to_host(check, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(again, ref) << "from host to other blocks";
  // One block through the single-block entry points: blocks[0] now holds the last copy's image (the
  // blocks were reversed above).
  std::vector<std::byte> one(kBlockBytes);
  ops->kv_block_to_host(layers, blocks[0], one.data());
  ops->synchronize();
  EXPECT_EQ(std::memcmp(one.data(), pinned + size_t(slots[kCopies - 1]) * kBlockBytes, kBlockBytes), 0);
}

TEST_F(KvHostCopy, BandwidthAgainstPinnedMemcpy) {
  const cudaStream_t st = static_cast<cudaStream_t>(ops->stream());
  const size_t total = kCopies * kBlockBytes;
  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, total), cudaSuccess);
  using Clock = std::chrono::steady_clock;
  auto best = [&](auto&& fn) {
    double t = 1e30;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      fn();
      EXPECT_EQ(cudaStreamSynchronize(st), cudaSuccess);
      t = std::min(t, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return double(total) / t / 1e9;
  };
  const auto c = copies(pinned);
  const double memcpy_d2h = best([&] { cudaMemcpyAsync(pinned, dev, total, cudaMemcpyDeviceToHost, st); });
  const double memcpy_h2d = best([&] { cudaMemcpyAsync(dev, pinned, total, cudaMemcpyHostToDevice, st); });
  const double batched_d2h = best([&] { ops->kv_blocks_to_host(layers, c); });
  const double batched_h2d = best([&] { ops->kv_blocks_from_host(layers, c); });
  const double per_layer_d2h = best([&] { per_layer_to_host(c, st); });
  std::printf(
      "[figures] kv host copy, %d blocks of %zu bytes (%d layers): to host %.1f GB/s (per-layer copies %.1f, "
      "pinned cudaMemcpy %.1f: %.0f%%), from host %.1f GB/s (pinned cudaMemcpy %.1f: %.0f%%)\n",
      kCopies, kBlockBytes, kLayers, batched_d2h, per_layer_d2h, memcpy_d2h, 100 * batched_d2h / memcpy_d2h,
      batched_h2d, memcpy_h2d, 100 * batched_h2d / memcpy_h2d);
  EXPECT_GT(batched_d2h, per_layer_d2h) << "batching should beat one copy per layer and block";
  cudaFree(dev);
}

}  // namespace
}  // namespace beluga
