// The GPU tests' common ground (tests/gpu/*_test.cc, one binary: test_gpu): the source tree, random
// BF16-exact inputs, the relative L2 error, and the GpuOps fixture that moves tensors between a CudaOps
// and the CPU backend. Inputs are rounded to BF16 first, so both backends see the same values; outputs
// are poisoned (0xFF bytes: NaN in BF16 and F32) before each op, so unwritten elements fail.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/cuda_ops.h"
#include "model/model.h"

namespace beluga::gpu_test {

inline bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

// The source tree (fixtures, configs): $BELUGA_SOURCE_DIR when set (a build carried to another
// machine), else the tree the binary was built from.
inline std::string source_dir() {
  const char* e = std::getenv("BELUGA_SOURCE_DIR");
  return e && *e ? std::string(e) : std::string(BELUGA_SOURCE_DIR);
}

inline std::mt19937_64& rng() {
  static std::mt19937_64 r(std::random_device{}());
  return r;
}

inline std::vector<float> rand_bf16(size_t n, float scale = 1.0f) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = bf16_to_f32(f32_to_bf16(d(rng())));
  return v;
}

inline double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += double(a[i] - ref[i]) * (a[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class GpuOps : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    gpu = std::make_unique<CudaOps>();
  }
  // A CPU F32 tensor over `host` (kept alive in `keep`).
  Tensor cpu_t(std::vector<float> v, std::initializer_list<int64_t> shape) {
    keep.push_back(std::move(v));
    return Tensor::make(keep.back().data(), DType::kF32, shape);
  }
  // A GPU tensor holding `v` (BF16 or F32).
  Tensor gpu_t(const std::vector<float>& v, std::initializer_list<int64_t> shape, DType dt = DType::kBF16) {
    Tensor t = gpu->scratch(dt, shape);
    if (dt == DType::kF32) {
      gpu->copy_from_host(t, v.data());
    } else {
      std::vector<uint16_t> b(v.size());
      for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
      gpu->copy_from_host(t, b.data());
    }
    return t;
  }
  Tensor gpu_i32(const std::vector<int32_t>& v) { return gpu_i32(v, {int64_t(v.size())}); }
  Tensor gpu_i32(const std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
    Tensor t = gpu->scratch(DType::kI32, shape);
    gpu->copy_from_host(t, v.data());
    return t;
  }
  std::vector<int32_t> read_i32(const Tensor& t) {
    std::vector<int32_t> out(size_t(t.numel()));
    gpu->copy_to_host(t, out.data());
    return out;
  }
  Tensor gpu_out(std::initializer_list<int64_t> shape, DType dt = DType::kBF16) {
    Tensor t = gpu->scratch(dt, shape);
    // On the ops' stream: the bytes may be scratch an op handed back while its kernels still run.
    cudaMemsetAsync(t.data, 0xff, t.nbytes(), static_cast<cudaStream_t>(gpu->stream()));
    return t;
  }
  std::vector<float> read(const Tensor& t) {
    std::vector<float> out(size_t(t.numel()));
    if (t.dtype == DType::kF32) {
      gpu->copy_to_host(t, out.data());
    } else {
      std::vector<uint16_t> b(out.size());
      gpu->copy_to_host(t, b.data());
      for (size_t i = 0; i < b.size(); ++i) out[i] = bf16_to_f32(b[i]);
    }
    return out;
  }
  static std::vector<float> read_cpu(const Tensor& t) {
    return std::vector<float>(t.ptr<float>(), t.ptr<float>() + t.numel());
  }
  // moe for T random rows against the composition norm_moe_gate + moe_experts (Ops::moe): output, new
  // residual and normalized rows bit for bit, twice (arrival counters, side-stream scratch and events
  // are reused between calls).
  void expect_moe_matches_composed(int T, const Tensor& norm_w, const MoeLayerRef& m) {
    const int D = int(norm_w.shape[0]);
    const Tensor gr = gpu_t(rand_bf16(size_t(T) * D), {T, D}), gd = gpu_t(rand_bf16(size_t(T) * D), {T, D});
    Tensor ref_res = gpu_out({T, D}), ref_x = gpu_out({T, D}), ref = gpu_out({T, D});
    gpu->Ops::moe(ref, {gr, gd, norm_w, ref_x, 1e-6f, ref_res}, m);
    const std::vector<float> want = read(ref);
    ASSERT_TRUE(std::all_of(want.begin(), want.end(), [](float v) { return std::isfinite(v); }));
    for (int rep = 0; rep < 2; ++rep) {
      Tensor res = gpu_out({T, D}), x = gpu_out({T, D}), out = gpu_out({T, D});
      gpu->moe(out, {gr, gd, norm_w, x, 1e-6f, res}, m);
      EXPECT_EQ(read(out), want) << "rep " << rep;
      EXPECT_EQ(read(res), read(ref_res)) << "rep " << rep;
      EXPECT_EQ(read(x), read(ref_x)) << "rep " << rep;
    }
  }

  CpuOps cpu;
  std::unique_ptr<CudaOps> gpu;
  std::vector<std::vector<float>> keep;
};

}  // namespace beluga::gpu_test
