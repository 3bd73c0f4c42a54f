// GPU tests: the GEMMs (cuBLAS linear with BF16 / FP8 / F32 weights, norm_linear, per-head products,
// and the batch-invariant GEMM of --deterministic) against the CPU backend. Bounds (relative L2, NaN never
// passes): 2e-2 (BF16 outputs). Not part of ctest: tests/gpu/run.sh runs test_gpu on a machine with a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>

#include "gpu_test_support.h"

namespace beluga {
namespace {

using namespace gpu_test;

// ---- GEMMs ----
TEST_F(GpuOps, Linear) {
  // M <= 4, N >= 256 or 128 < K <= 512, K % 8 == 0: the GEMV kernel (K = 1408 leaves lanes uneven;
  // K <= 128: several rows per warp; N 208 at K 256: the demo model's q_a + kv_a); the rest (N 192 at
  // K 128: its q_b) cuBLAS.
  for (auto [M, N, K] : {std::tuple{1, 2112, 2048},
                         {3, 3072, 2048},
                         {4, 512, 1408},
                         {2, 301, 64},   // 8 lanes per row, units past N in the last warp
                         {1, 260, 120},  // 16 lanes per row, K8 = 15
                         {1, 64, 2048},
                         {2, 100, 100},
                         {4, 192, 128},
                         {1, 208, 256},
                         {17, 576, 2048},
                         {300, 1024, 512}}) {
    auto x = rand_bf16(size_t(M) * K), w = rand_bf16(size_t(N) * K, 0.05f), b = rand_bf16(N);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
    Weight cw;
    cw.w = Tensor::make(wb.data(), DType::kBF16, {N, K});
    cw.bias = cpu_t(b, {N});
    Tensor co = cpu_t(std::vector<float>(size_t(M) * N), {M, N});
    cpu.linear(co, cpu_t(x, {M, K}), cw);
    Weight gw;
    gw.w = gpu->upload(cw.w);
    gw.bias = gpu_t(b, {N});
    for (DType odt : {DType::kBF16, DType::kF32}) {
      Tensor go = gpu_out({M, N}, odt);
      gpu->linear(go, gpu_t(x, {M, K}), gw);
      EXPECT_LE(rel_l2(read(go), read_cpu(co)), 2e-2) << M << "x" << N << "x" << K;
    }
  }
}

// norm_linear (add_rmsnorm folded into the decode GEMV) leaves the product, the residual and the
// normalized rows bit-identical to add_rmsnorm + linear on the same backend, and matches the CPU.
// M 1..4 take the fused kernel (with and without a delta; BF16 and F32 outputs; N 208 at D 256, the
// demo model's q_a + kv_a); 6 rows and a biased weight fall back to the composition. Each case runs twice:
// the arrival counter must be back at 0 after a call.
TEST_F(GpuOps, NormLinearMatchesComposed) {
  for (auto [D, M, N, with_delta, bias, odt] : {std::tuple{2048, 1, 3648, true, false, DType::kBF16},
                                                {2048, 1, 2048, false, false, DType::kF32},
                                                {2048, 3, 2816, true, false, DType::kBF16},
                                                {2048, 4, 1024, true, false, DType::kF32},
                                                {2048, 6, 512, true, false, DType::kBF16},
                                                {2048, 1, 512, true, true, DType::kBF16},
                                                {256, 1, 208, true, false, DType::kBF16},
                                                {256, 4, 208, true, false, DType::kBF16}}) {
    SCOPED_TRACE(testing::Message() << "D " << D << " M " << M << " N " << N << " delta " << with_delta
                                    << " bias " << bias);
    const auto nw = rand_bf16(size_t(D));
    const auto r = rand_bf16(size_t(M) * D), d = rand_bf16(size_t(M) * D),
               w = rand_bf16(size_t(N) * D, 0.05f);
    Weight gw;
    gw.w = gpu_t(w, {N, D});
    if (bias) gw.bias = gpu_t(rand_bf16(N), {N});
    const Tensor gnw = gpu_t(nw, {D}, DType::kF32), gd = gpu_t(d, {M, D}), gres = gpu_t(r, {M, D});
    // The composition on the GPU: add_rmsnorm in place.
    Tensor ref_res = gpu_t(r, {M, D}), ref_x = gpu_out({M, D}), ref = gpu_out({M, N}, odt);
    gpu->normalize({ref_res, with_delta ? gd : Tensor{}, gnw, ref_x, 1e-6f, Tensor{}});
    gpu->linear(ref, ref_x, gw);
    // The CPU.
    Tensor cres = cpu_t(r, {M, D}), cx = cpu_t(std::vector<float>(size_t(M) * D), {M, D});
    Weight cw;
    cw.w = cpu_t(w, {N, D});
    cpu.normalize({cres, with_delta ? cpu_t(d, {M, D}) : Tensor{}, cpu_t(nw, {D}), cx, 1e-6f, Tensor{}});
    Tensor co = cpu_t(std::vector<float>(size_t(M) * N), {M, N});
    cpu.linear(co, cx, cw);
    for (int rep = 0; rep < 2; ++rep) {
      // Out of place (as the model runs it): gres stays, res_out gets the sum.
      Tensor res_out = gpu_out({M, D}), x = gpu_out({M, D}), out = gpu_out({M, N}, odt);
      gpu->norm_linear(out, {gres, with_delta ? gd : Tensor{}, gnw, x, 1e-6f, res_out}, gw);
      EXPECT_EQ(read(gres), r) << "rep " << rep;
      if (with_delta) {
        EXPECT_EQ(read(res_out), read(ref_res)) << "rep " << rep;
      }
      EXPECT_EQ(read(x), read(ref_x)) << "rep " << rep;
      EXPECT_EQ(read(out), read(ref)) << "rep " << rep;
      if (!bias) {
        EXPECT_LE(rel_l2(read(out), read_cpu(co)), 2e-2) << "rep " << rep;
      }
    }
  }
}

// mtp_input (the MTP module's gathers, two norms and eh_proj in one kernel) gives the bits of the
// composition on the same backend (Ops::mtp_input) and matches the CPU: ids by row (a chained pass) or
// by token, hidden rows gathered or in place; 1-4 rows take the fused kernel (the demo's D 256), 6 rows
// and D 64 (a product on 8 lanes) the composition. The rows are permuted so a row/ids mix-up shows.
TEST_F(GpuOps, MtpInputMatchesComposed) {
  const int V = 50;
  for (auto [D, T, by_row, gathered] : {std::tuple{256, 1, false, false},
                                        {256, 1, true, true},
                                        {256, 3, false, true},
                                        {256, 4, true, true},
                                        {256, 4, false, false},
                                        {512, 2, true, true},
                                        {256, 6, true, true},
                                        {64, 2, false, true}}) {
    SCOPED_TRACE(testing::Message() << "D " << D << " T " << T << " by_row " << by_row << " gathered "
                                    << gathered);
    const int H = T + 3;  // hidden rows (and ids, by row)
    const auto table = rand_bf16(size_t(V) * D), hidden = rand_bf16(size_t(H) * D), en = rand_bf16(size_t(D)),
               hn = rand_bf16(size_t(D)), w = rand_bf16(size_t(D) * 2 * D, 0.05f);
    std::vector<int32_t> rows(T), ids(by_row ? H : T);
    for (int t = 0; t < T; ++t) rows[t] = (t * 2 + 1) % H;
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((i * 17 + 5) % V);
    Weight gw;
    gw.w = gpu_t(w, {D, 2 * D});
    const MtpInput g{gpu_t(table, {V, D}),
                     gpu_i32(ids),
                     gpu_t(hidden, {H, D}),
                     gathered ? gpu_i32(rows) : Tensor{},
                     gpu_t(en, {D}, DType::kF32),
                     gpu_t(hn, {D}),
                     by_row,
                     1e-6f};
    Tensor ref = gpu_out({T, D});
    gpu->Ops::mtp_input(ref, g, gw);
    Tensor out = gpu_out({T, D});
    gpu->mtp_input(out, g, gw);
    EXPECT_EQ(read(out), read(ref));
    // The CPU (F32) from the same inputs.
    Weight cw;
    cw.w = cpu_t(w, {D, 2 * D});
    const MtpInput c{cpu_t(table, {V, D}),
                     Tensor::make(ids.data(), DType::kI32, {int64_t(ids.size())}),
                     cpu_t(hidden, {H, D}),
                     gathered ? Tensor::make(rows.data(), DType::kI32, {T}) : Tensor{},
                     cpu_t(en, {D}),
                     cpu_t(hn, {D}),
                     by_row,
                     1e-6f};
    Tensor co = cpu_t(std::vector<float>(size_t(T) * D), {T, D});
    cpu.mtp_input(co, c, cw);
    EXPECT_LE(rel_l2(read(out), read_cpu(co)), 2e-2);
  }
}

TEST_F(GpuOps, LinearFp8AndF32Weights) {
  const int M = 5, N = 256, K = 384;
  std::vector<uint8_t> w8(size_t(N) * K);
  for (auto& v : w8) {
    v = uint8_t(rng()() & 0xff);
    if ((v & 0x7f) == 0x7f) v = 0x30;
  }
  std::vector<float> sc = {0.01f, 0.02f, 0.005f, 0.03f, 0.01f, 0.02f};  // [2, 3]
  Weight cw;
  cw.w = Tensor::make(w8.data(), DType::kF8E4M3, {N, K});
  cw.scale = cpu_t(sc, {2, 3});
  auto x = rand_bf16(size_t(M) * K);
  Tensor co = cpu_t(std::vector<float>(size_t(M) * N), {M, N});
  cpu.linear(co, cpu_t(x, {M, K}), cw);
  Weight gw;
  gw.w = gpu->upload(cw.w);
  gw.scale = gpu->upload(cw.scale);
  Tensor go = gpu_out({M, N});
  gpu->linear(go, gpu_t(x, {M, K}), gw);
  EXPECT_LE(rel_l2(read(go), read_cpu(co)), 2e-2);

  auto wf = rand_bf16(size_t(N) * K, 0.05f);
  Weight cf;
  cf.w = cpu_t(wf, {N, K});
  cpu.linear(co, cpu_t(x, {M, K}), cf);
  Weight gf;
  gf.w = gpu->upload(cf.w);
  Tensor go2 = gpu_out({M, N}, DType::kF32);
  gpu->linear(go2, gpu_t(x, {M, K}), gf);
  EXPECT_LE(rel_l2(read(go2), read_cpu(co)), 2e-2);
}

TEST_F(GpuOps, LinearHeads) {
  for (int T : {1, 3, 33}) {  // 1, 3: the per-head GEMV; 33: cuBLAS batched
    const int H = 16, K = 128, N = 512;
    auto x = rand_bf16(size_t(T) * H * 192), w = rand_bf16(size_t(H) * N * K, 0.1f);
    Tensor cw = cpu_t(w, {H, N, K});
    Tensor cx = cpu_t(x, {T, H, 192});
    Tensor co = cpu_t(std::vector<float>(size_t(T) * H * 576), {T, H, 576});
    cpu.linear_heads(co.cols(0, N), cx.cols(0, K), cw);
    Tensor go = gpu_out({T, H, 576});
    Tensor gw = gpu_t(w, {H, N, K});
    gpu->linear_heads(go.cols(0, N), gpu_t(x, {T, H, 192}).cols(0, K), gw);
    auto a = read(go), b = read_cpu(co);
    std::vector<float> a2, b2;
    for (size_t i = 0; i < a.size(); ++i)
      if (i % 576 < size_t(N)) {
        a2.push_back(a[i]);
        b2.push_back(b[i]);
      }
    EXPECT_LE(rel_l2(a2, b2), 2e-2) << "T " << T;
  }
}

// --deterministic's GEMM (CudaOptions::deterministic: every linear and per-head product): a row's output
// bits are the same whether it is computed with 1, 3, 16, 17, 64, 65, 128 or 300 rows, and wherever it
// sits in its tile (the batch starts at row 0 or row 5); x views whose rows are not 16-byte pieces are
// copied first and give the same bits; the result matches the CPU.
TEST_F(GpuOps, DeterministicGemmRowsDoNotDependOnTheBatch) {
  CudaOptions o;
  o.deterministic = true;
  CudaOps det(o);
  const int kRows = 300;
  for (auto [N, K] : {std::pair{2112, 2048}, {301, 120}, {64, 1408}, {1024, 512}}) {
    auto x = rand_bf16(size_t(kRows + 1) * K), w = rand_bf16(size_t(N) * K, 0.05f);
    std::vector<uint16_t> wb(w.size());
    for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
    Weight cw;
    cw.w = Tensor::make(wb.data(), DType::kBF16, {N, K});
    Tensor co = cpu_t(std::vector<float>(size_t(kRows) * N), {kRows, N});
    cpu.linear(co, cpu_t(std::vector<float>(x.begin(), x.begin() + int64_t(kRows) * K), {kRows, K}), cw);
    Weight gw;
    gw.w = det.upload(cw.w);
    // x in a [kRows + 1, K + 8] buffer, its rows from column 0 (16-byte rows) or column 1 (not).
    for (DType odt : {DType::kF32, DType::kBF16}) {
      for (int shift : {0, 1}) {
        std::vector<float> xs(size_t(kRows + 1) * (K + 8), 0.0f);
        for (int r = 0; r < kRows; ++r)
          std::copy(x.begin() + int64_t(r) * K, x.begin() + int64_t(r + 1) * K,
                    xs.begin() + r * (K + 8) + shift);
        Tensor gx = det.scratch(DType::kBF16, {kRows + 1, K + 8});
        std::vector<uint16_t> xb(xs.size());
        for (size_t i = 0; i < xs.size(); ++i) xb[i] = f32_to_bf16(xs[i]);
        det.copy_from_host(gx, xb.data());
        const Tensor xv = gx.cols(shift, shift + K);
        Tensor full = det.scratch(odt, {kRows, N});
        det.linear(full, xv.rows(0, kRows), gw);
        auto bits = [&](const Tensor& t, int rows) {
          std::vector<uint32_t> b(size_t(rows) * N);
          if (odt == DType::kF32) {
            det.copy_to_host(t, b.data());
          } else {
            std::vector<uint16_t> h(b.size());
            det.copy_to_host(t, h.data());
            for (size_t i = 0; i < h.size(); ++i) b[i] = h[i];
          }
          return b;
        };
        const std::vector<uint32_t> fb = bits(full, kRows);
        if (odt == DType::kF32) {
          std::vector<float> f(fb.size());
          std::memcpy(f.data(), fb.data(), fb.size() * 4);
          EXPECT_LE(rel_l2(f, read_cpu(co)), 1e-2) << N << "x" << K;
        }
        for (int M : {1, 3, 16, 17, 64, 65, 128}) {
          for (int r0 : {0, 5}) {
            Tensor part = det.scratch(odt, {M, N});
            det.linear(part, xv.rows(r0, r0 + M), gw);
            const std::vector<uint32_t> pb = bits(part, M);
            EXPECT_TRUE(std::equal(pb.begin(), pb.end(), fb.begin() + int64_t(r0) * N))
                << "rows " << r0 << ".." << r0 + M << " of " << N << "x" << K << " shift " << shift
                << (odt == DType::kF32 ? " f32" : " bf16");
          }
        }
        det.reset_scratch();
      }
    }
  }
}

// The per-head product of --deterministic (the absorbed MLA's W_UK and W_UV): a token's rows are
// the same with 1, 3, 33 or 200 tokens, and match the CPU.
TEST_F(GpuOps, DeterministicLinearHeadsRowsDoNotDependOnTheBatch) {
  CudaOptions o;
  o.deterministic = true;
  CudaOps det(o);
  const int H = 16, K = 128, N = 512, kT = 200;
  auto x = rand_bf16(size_t(kT) * H * 192), w = rand_bf16(size_t(H) * N * K, 0.1f);
  Tensor cw = cpu_t(w, {H, N, K});
  Tensor co = cpu_t(std::vector<float>(size_t(kT) * H * N), {kT, H, N});
  cpu.linear_heads(co, cpu_t(x, {kT, H, 192}).cols(0, K), cw);
  std::vector<uint16_t> xb(x.size()), wb(w.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wb[i] = f32_to_bf16(w[i]);
  Tensor gx = det.scratch(DType::kBF16, {kT, H, 192});
  det.copy_from_host(gx, xb.data());
  const Tensor gw = det.upload(Tensor::make(wb.data(), DType::kBF16, {H, N, K}));
  auto run = [&](int T) {
    Tensor out = det.scratch(DType::kBF16, {T, H, N});
    det.linear_heads(out, gx.rows(0, T).cols(0, K), gw);
    std::vector<uint16_t> h(size_t(T) * H * N);
    det.copy_to_host(out, h.data());
    return h;
  };
  const std::vector<uint16_t> full = run(kT);
  std::vector<float> f(full.size());
  for (size_t i = 0; i < full.size(); ++i) f[i] = bf16_to_f32(full[i]);
  EXPECT_LE(rel_l2(f, read_cpu(co)), 2e-2);
  for (int T : {1, 3, 33}) {
    const std::vector<uint16_t> part = run(T);
    EXPECT_TRUE(std::equal(part.begin(), part.end(), full.begin())) << "T " << T;
  }
}

}  // namespace
}  // namespace beluga
