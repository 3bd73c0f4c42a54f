// load_stacked: one weight for several linears must give each part's outputs exactly as the separate
// products do, for BF16 (with a bias on one part only), FP8 parts that start on scale blocks (kept
// FP8, scales stacked) and FP8 parts that do not (dequantized to F32).
#include "model/stacked_weight.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "backend/cpu/cpu_ops.h"
#include "util/error.h"

namespace beluga {
namespace {

// Tensors by name from memory the source owns.
class MapSource : public WeightSource {
 public:
  void add(const std::string& name, DType dt, std::vector<int64_t> shape, const void* data) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto& buf = store_.emplace_back(size_t(n) * dtype_size(dt));
    std::memcpy(buf.data(), data, buf.size());
    tensors_[name] = Tensor::make(buf.data(), dt, shape.data(), int(shape.size()));
  }
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType hint = DType::kBF16) override {
    Tensor t = find(name, shape, hint);
    BELUGA_CHECK(!t.empty(), "no tensor ", name);
    return t;
  }
  Tensor find(const std::string& name, const std::vector<int64_t>& shape, DType = DType::kBF16) override {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return {};
    for (size_t d = 0; d < shape.size(); ++d) BELUGA_CHECK(it->second.shape[d] == shape[d], name, ": shape");
    return it->second;
  }
  size_t total_bytes() const override { return 0; }

 private:
  std::vector<std::vector<unsigned char>> store_;
  std::map<std::string, Tensor> tensors_;
};

std::mt19937& rng() {
  static std::mt19937 g(7);
  return g;
}

std::vector<float> randn(size_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng());
  return v;
}

// x [M, in] through `w` (CPU backend).
std::vector<float> apply(CpuOps& ops, const Weight& w, std::vector<float> x, int64_t M) {
  const int64_t in = w.in_features(), out = w.out_features();
  std::vector<float> y(size_t(M * out));
  ops.linear(Tensor::make(y.data(), DType::kF32, {M, out}), Tensor::make(x.data(), DType::kF32, {M, in}), w);
  return y;
}

// Columns [c0, c0 + n) of y [M, width].
std::vector<float> cols(const std::vector<float>& y, int64_t M, int64_t width, int64_t c0, int64_t n) {
  std::vector<float> r;
  for (int64_t m = 0; m < M; ++m)
    r.insert(r.end(), y.begin() + m * width + c0, y.begin() + m * width + c0 + n);
  return r;
}

TEST(StackedWeight, Bf16PartsAndOneBias) {
  CpuOps ops({1});
  MapSource src;
  const int64_t in = 16, M = 3, outs[2] = {5, 3};
  std::vector<Weight> parts(2);
  for (int i = 0; i < 2; ++i) {
    std::vector<uint16_t> w(size_t(outs[i] * in));
    const std::vector<float> wf = randn(w.size());
    for (size_t j = 0; j < w.size(); ++j) w[j] = f32_to_bf16(wf[j]);
    src.add("p" + std::to_string(i) + ".weight", DType::kBF16, {outs[i], in}, w.data());
    parts[size_t(i)].w = src.get("p" + std::to_string(i) + ".weight", {outs[i], in});
  }
  const std::vector<float> b = randn(3);
  src.add("p1.bias", DType::kF32, {3}, b.data());
  parts[1].bias = src.get("p1.bias", {3});
  int64_t n_params = 0;
  const Weight s = load_stacked(src, ops, {"p0", "p1"}, {5, 3}, in, 128, 128, &n_params);
  EXPECT_EQ(s.w.dtype, DType::kBF16);
  EXPECT_EQ(s.out_features(), 8);
  EXPECT_EQ(n_params, 8 * in + 3);
  const std::vector<float> x = randn(size_t(M * in));
  const std::vector<float> y = apply(ops, s, x, M);
  EXPECT_EQ(cols(y, M, 8, 0, 5), apply(ops, parts[0], x, M));  // zeros for the part without a bias
  EXPECT_EQ(cols(y, M, 8, 5, 3), apply(ops, parts[1], x, M));
}

// FP8 parts of `outs` rows with bn x bk scale blocks; returns the separate weights.
std::vector<Weight> add_fp8(MapSource& src, const std::vector<int64_t>& outs, int64_t in, int64_t bn,
                            int64_t bk) {
  std::vector<Weight> parts;
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.01f, 0.1f);
  for (size_t i = 0; i < outs.size() && i < 2; ++i) {
    const std::string p = i == 0 ? "f0" : "f1";  // (GCC 12 warns on "f" + to_string here)
    std::vector<uint8_t> q(size_t(outs[i] * in));
    for (auto& v : q) {
      v = uint8_t(byte(rng()));
      if ((v & 0x7f) == 0x7f) v = 0x38;  // no NaN codes
    }
    const int64_t sr = (outs[i] + bn - 1) / bn, sc = (in + bk - 1) / bk;
    std::vector<float> s(size_t(sr * sc));
    for (auto& v : s) v = scale(rng());
    src.add(p + ".weight", DType::kF8E4M3, {outs[i], in}, q.data());
    src.add(p + ".weight_scale_inv", DType::kF32, {sr, sc}, s.data());
    Weight w;
    w.w = src.get(p + ".weight", {outs[i], in});
    w.scale = src.get(p + ".weight_scale_inv", {sr, sc});
    w.block_n = int(bn);
    w.block_k = int(bk);
    parts.push_back(w);
  }
  return parts;
}

TEST(StackedWeight, Fp8PartsOnScaleBlocksStayFp8) {
  CpuOps ops({1});
  MapSource src;
  const int64_t in = 40, M = 2, bn = 4, bk = 16;  // the CPU kernels want bk % 16 == 0
  const std::vector<Weight> parts = add_fp8(src, {8, 6}, in, bn, bk);
  const Weight s = load_stacked(src, ops, {"f0", "f1"}, {8, 6}, in, bn, bk, nullptr);
  ASSERT_EQ(s.w.dtype, DType::kF8E4M3);
  EXPECT_EQ(s.scale.shape[0], 4);  // ceil(14 / 4) scale rows
  const std::vector<float> x = randn(size_t(M * in));
  const std::vector<float> y = apply(ops, s, x, M);
  EXPECT_EQ(cols(y, M, 14, 0, 8), apply(ops, parts[0], x, M));
  EXPECT_EQ(cols(y, M, 14, 8, 6), apply(ops, parts[1], x, M));
}

TEST(StackedWeight, Fp8PartsOffScaleBlocksBecomeF32) {
  CpuOps ops({1});
  MapSource src;
  const int64_t in = 40, M = 2, bn = 4, bk = 16;
  const std::vector<Weight> parts = add_fp8(src, {6, 5}, in, bn, bk);  // part 1 would start mid-block
  const Weight s = load_stacked(src, ops, {"f0", "f1"}, {6, 5}, in, bn, bk, nullptr);
  ASSERT_EQ(s.w.dtype, DType::kF32);
  const std::vector<float> x = randn(size_t(M * in));
  const std::vector<float> y = apply(ops, s, x, M);
  const std::vector<float> a = cols(y, M, 11, 0, 6), b = cols(y, M, 11, 6, 5);
  const std::vector<float> ra = apply(ops, parts[0], x, M), rb = apply(ops, parts[1], x, M);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], ra[i], 1e-5f * (1 + std::abs(ra[i])));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(b[i], rb[i], 1e-5f * (1 + std::abs(rb[i])));
}

TEST(StackedWeight, MixedDtypesAreRejected) {
  CpuOps ops({1});
  MapSource src;
  const std::vector<float> f(4 * 8, 0.5f);
  std::vector<uint16_t> h(4 * 8, f32_to_bf16(0.5f));
  src.add("a.weight", DType::kF32, {4, 8}, f.data());
  src.add("b.weight", DType::kBF16, {4, 8}, h.data());
  EXPECT_THROW(load_stacked(src, ops, {"a", "b"}, {4, 4}, 8, 128, 128, nullptr), Error);
}

}  // namespace
}  // namespace beluga
