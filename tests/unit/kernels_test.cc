// Every SIMD kernel table against the scalar reference: GEMM over F32/BF16/FP8 weights with K and N
// tails, BF16 activations, dot and axpy; FP8 e4m3 decoding on hand-checked bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "backend/cpu/kernels.h"

namespace beluga::cpu {
namespace {

std::vector<const Kernels*> tables() {
  std::vector<const Kernels*> t;
  if (cpu_has_avx2()) t.push_back(&kernels_avx2());
  if (cpu_has_avx512_bf16()) t.push_back(&kernels_avx512());
  return t;
}

TEST(Fp8, DecodesE4M3) {
  EXPECT_EQ(f8e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0xb8), -1.0f);
  EXPECT_EQ(f8e4m3_to_f32(0x7e), 448.0f);                // largest finite
  EXPECT_EQ(f8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest denormal: 1/8 * 2^-6
  EXPECT_EQ(f8e4m3_to_f32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(f8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(f8e4m3_to_f32(0x3c), 1.5f);
  EXPECT_EQ(f8e4m3_to_f32(0x00), 0.0f);
  EXPECT_TRUE(std::isnan(f8e4m3_to_f32(0x7f)));
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808000)), 0x3f80);  // tie -> even
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f818000)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(f32_to_bf16(bits_to_f32(0x3f808001)), 0x3f81);
  EXPECT_EQ(bf16_to_f32(0xc000), -2.0f);
}

struct Case {
  int M, N, K;
  DType wt;
  bool bf16_act;
  bool split = false;  // x as three exact bf16 terms (F32-exact path)
};

void run_case(const Kernels& k, const Case& c) {
  std::mt19937 rng(c.M * 131 + c.N * 7 + c.K);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(size_t(c.M) * c.K);
  for (auto& v : x) v = u(rng);
  std::vector<uint16_t> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  std::vector<float> wf(size_t(c.N) * c.K);
  std::vector<uint16_t> wb(wf.size());
  std::vector<uint8_t> w8(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) {
    wf[i] = u(rng);
    wb[i] = f32_to_bf16(wf[i]);
    w8[i] = uint8_t(rng() & 0xff);
    if ((w8[i] & 0x7f) == 0x7f) w8[i] = 0x30;  // no NaN
  }
  const int bn = 128, bk = 128, sn = (c.N + bn - 1) / bn, sk = (c.K + bk - 1) / bk;
  std::vector<float> scale(size_t(sn) * sk);
  for (auto& s : scale) s = 0.001f + std::abs(u(rng)) * 0.01f;
  GemmArgs a{};
  a.x = x.data();
  a.ldx = c.K;
  a.M = c.M;
  a.K = c.K;
  a.wtype = c.wt;
  a.w = c.wt == DType::kF32    ? static_cast<const void*>(wf.data())
        : c.wt == DType::kBF16 ? static_cast<const void*>(wb.data())
                               : w8.data();
  a.ldw = c.K;
  a.scale = scale.data();
  a.lds = sk;
  a.bn = bn;
  a.bk = bk;
  if (c.bf16_act) {
    a.xb = xb.data();
    a.ldxb = c.K;
  }
  std::vector<uint16_t> xs(x.size() * 3);
  if (c.split) {
    for (int m = 0; m < c.M; ++m)
      k.split_bf16x3(x.data() + size_t(m) * c.K, xs.data() + size_t(m) * 3 * c.K, c.K);
    a.xs = xs.data();
  }
  std::vector<float> ref(size_t(c.M) * c.N), got(ref.size(), -7.0f);
  a.out = ref.data();
  a.ldo = c.N;
  kernels_scalar().gemm(a, 0, c.N);
  a.out = got.data();
  // Two column ranges: checks that a call writes only its own columns.
  const int split = (c.N / 2) & ~3;
  k.gemm(a, 0, split);
  k.gemm(a, split, c.N);
  for (int m = 0; m < c.M; ++m)
    for (int n = 0; n < c.N; ++n) {
      const float r = ref[size_t(m) * c.N + n], g = got[size_t(m) * c.N + n];
      ASSERT_NEAR(g, r, 1e-5f * (1 + std::abs(r)) * std::sqrt(float(c.K)))
          << k.name << " M=" << c.M << " N=" << c.N << " K=" << c.K << " wt=" << int(c.wt) << " at " << m
          << "," << n;
    }
}

TEST(Kernels, GemmMatchesScalar) {
  const Case cases[] = {{1, 7, 5, DType::kF32, false},
                        {3, 9, 33, DType::kBF16, false},
                        {5, 13, 100, DType::kBF16, true},
                        {4, 16, 256, DType::kBF16, true},
                        {7, 130, 300, DType::kF8E4M3, false},
                        {1, 260, 129, DType::kF8E4M3, false},
                        {9, 37, 70, DType::kF32, false},
                        {2, 64, 1000, DType::kBF16, false},
                        {1, 77, 1000, DType::kBF16, false, true},
                        {2, 9, 45, DType::kBF16, false, true},
                        {3, 16, 512, DType::kBF16, false, true}};
  auto ts = tables();
  for (const Kernels* k : ts)
    for (const Case& c : cases) run_case(*k, c);
}

TEST(Kernels, GemmNnMatchesScalar) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Kernels* k : tables()) {
    for (auto [M, K, N] : {std::tuple{1, 1, 1}, {3, 96, 70}, {4, 64, 64}, {33, 17, 200}, {5, 576, 129}}) {
      std::vector<float> x(size_t(M) * K), b(size_t(K) * (N + 3)), r1(size_t(M) * N), r2(size_t(M) * N);
      for (auto& v : x) v = u(rng);
      for (auto& v : b) v = u(rng);
      kernels_scalar().gemm_nn(x.data(), K, M, K, b.data(), N + 3, N, r1.data(), N);
      k->gemm_nn(x.data(), K, M, K, b.data(), N + 3, N, r2.data(), N);
      for (size_t i = 0; i < r1.size(); ++i)
        ASSERT_NEAR(r2[i], r1[i], 1e-5f * std::sqrt(float(K))) << k->name << " " << M << "x" << K << "x" << N;
    }
  }
}

TEST(Kernels, SplitIntoThreeBf16TermsIsExact) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-100, 100);
  const Kernels* all[] = {&kernels_scalar(), &kernels_avx2(), &kernels_avx512()};
  for (const Kernels* k : all) {
    if ((k == &kernels_avx2() && !cpu_has_avx2()) || (k == &kernels_avx512() && !cpu_has_avx512_bf16()))
      continue;
    std::vector<float> x(37);
    for (auto& v : x) v = u(rng) * std::pow(10.0f, float(int(rng() % 20)) - 10.0f);
    std::vector<uint16_t> y(3 * x.size());
    k->split_bf16x3(x.data(), y.data(), int(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float sum = bf16_to_f32(y[i]) + bf16_to_f32(y[x.size() + i]) + bf16_to_f32(y[2 * x.size() + i]);
      EXPECT_EQ(sum, x[i]) << k->name << " " << i;
    }
  }
}

TEST(Kernels, DotAxpyToBf16MatchScalar) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (const Kernels* k : tables()) {
    for (int n : {1, 15, 16, 17, 63, 64, 100}) {
      std::vector<float> a(n), b(n), y1(n), y2(n);
      for (int i = 0; i < n; ++i) {
        a[i] = u(rng);
        b[i] = u(rng);
        y1[i] = y2[i] = u(rng);
      }
      EXPECT_NEAR(k->dot(a.data(), b.data(), n), kernels_scalar().dot(a.data(), b.data(), n), 1e-5)
          << k->name << n;
      k->axpy(0.75f, a.data(), y1.data(), n);
      kernels_scalar().axpy(0.75f, a.data(), y2.data(), n);
      for (int i = 0; i < n; ++i) EXPECT_NEAR(y1[i], y2[i], 1e-6) << k->name;
      std::vector<uint16_t> h1(n), h2(n);
      k->to_bf16(a.data(), h1.data(), n);
      kernels_scalar().to_bf16(a.data(), h2.data(), n);
      EXPECT_EQ(h1, h2) << k->name;
    }
  }
}

TEST(Kernels, ExpSumAndSiluMatchLibm) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-30, 30);
  for (const Kernels* k : tables()) {
    for (int n : {1, 7, 16, 33, 200}) {
      std::vector<float> x(n), ref(n), g(n), v(n), out(n);
      for (int i = 0; i < n; ++i) {
        x[i] = ref[i] = u(rng);
        g[i] = u(rng);
        v[i] = u(rng) / 30;
      }
      x[0] = ref[0] = -1e30f;  // a masked score: exp gives 0
      // Bound: the float argument x*0.5-3 itself carries ~1e-6 relative error for |x| near 30.
      const float s = k->exp_sum(x.data(), n, 0.5f, 3.0f);
      double sref = 0;
      for (int i = 0; i < n; ++i) {
        const double e = std::exp(double(ref[i]) * 0.5 - 3.0);
        EXPECT_NEAR(x[i], e, 3e-6 * e + 1e-30) << k->name << " i=" << i << " x=" << ref[i];
        sref += e;
      }
      EXPECT_NEAR(s, sref, 3e-6 * sref) << k->name;
      k->silu_mul(g.data(), v.data(), out.data(), n);
      for (int i = 0; i < n; ++i) {
        const double e = g[i] / (1 + std::exp(-double(g[i]))) * v[i];
        EXPECT_NEAR(out[i], e, 1e-6 * std::abs(e) + 1e-12) << k->name << " g=" << g[i];
      }
    }
  }
}

}  // namespace
}  // namespace beluga::cpu
