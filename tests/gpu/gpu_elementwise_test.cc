// GPU tests: the element-wise CUDA ops (norms, SiLU, copies, gathers, embedding, argmax, rope, MLA's
// prologue) against the CPU backend on random inputs at several shapes. Bounds (relative L2 over the
// output, NaN never passes): 1e-2 (one BF16 rounding of the output is ~3e-3).
// Not part of ctest: tests/gpu/run.sh runs test_gpu on a machine with a GPU.
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

// ---- element-wise ----
// One warp per row; D 100 takes the lane-strided path (rows not in 16-byte chunks). add_rmsnorm in
// place and normalize out of place (the residual kept, the sum in residual_out) give the same bits.
TEST_F(GpuOps, RmsNormAndAddRmsNorm) {
  for (auto [R, D] : {std::pair{1, 64}, {7, 2048}, {3, 100}, {130, 7168}}) {
    auto x = rand_bf16(size_t(R) * D), w = rand_bf16(D), r = rand_bf16(size_t(R) * D);
    Tensor co = cpu_t(std::vector<float>(size_t(R) * D), {R, D});
    cpu.rmsnorm(co, cpu_t(x, {R, D}), cpu_t(w, {D}), 1e-6f);
    Tensor go = gpu_out({R, D});
    gpu->rmsnorm(go, gpu_t(x, {R, D}), gpu_t(w, {D}), 1e-6f);
    EXPECT_LE(rel_l2(read(go), read_cpu(co)), 1e-2) << R << "x" << D;

    Tensor cres = cpu_t(r, {R, D});
    Tensor co2 = cpu_t(std::vector<float>(size_t(R) * D), {R, D});
    cpu.add_rmsnorm(cres, cpu_t(x, {R, D}), co2, cpu_t(w, {D}), 1e-6f);
    Tensor gres = gpu_t(r, {R, D});
    Tensor go2 = gpu_out({R, D});
    gpu->add_rmsnorm(gres, gpu_t(x, {R, D}), go2, gpu_t(w, {D}, DType::kF32), 1e-6f);
    EXPECT_LE(rel_l2(read(go2), read_cpu(co2)), 1e-2);
    EXPECT_LE(rel_l2(read(gres), read_cpu(cres)), 1e-2);

    const Tensor gr = gpu_t(r, {R, D});
    Tensor res_out = gpu_out({R, D}), go3 = gpu_out({R, D});
    gpu->normalize({gr, gpu_t(x, {R, D}), gpu_t(w, {D}, DType::kF32), go3, 1e-6f, res_out});
    EXPECT_EQ(read(gr), r);
    EXPECT_EQ(read(res_out), read(gres));
    EXPECT_EQ(read(go3), read(go2));
  }
}

TEST_F(GpuOps, SiluMulAddCopyGatherEmbedding) {
  const int R = 37, D = 512, V = 1000;
  for (int I : {1408, 12}) {  // 16-byte pieces, and the scalar kernel (I % 8 != 0)
    auto gu = rand_bf16(size_t(R) * 2 * I, 4.0f);
    Tensor co = cpu_t(std::vector<float>(size_t(R) * I), {R, I});
    cpu.silu_mul(co, cpu_t(gu, {R, 2 * I}));
    Tensor go = gpu_out({R, I});
    gpu->silu_mul(go, gpu_t(gu, {R, 2 * I}));
    EXPECT_LE(rel_l2(read(go), read_cpu(co)), 1e-2) << "I " << I;
  }

  auto a = rand_bf16(size_t(R) * D), b = rand_bf16(size_t(R) * D);
  Tensor cadd = cpu_t(std::vector<float>(size_t(R) * D), {R, D});
  cpu.add(cadd, cpu_t(a, {R, D}), cpu_t(b, {R, D}));
  Tensor gadd = gpu_out({R, D});
  gpu->add(gadd, gpu_t(a, {R, D}), gpu_t(b, {R, D}));
  EXPECT_LE(rel_l2(read(gadd), read_cpu(cadd)), 1e-2);

  // Strided 3-D copy (a column slice of heads), BF16 -> F32 and BF16 -> BF16.
  const int T = 5, H = 16, W = 192;
  auto q = rand_bf16(size_t(T) * H * W);
  Tensor gq = gpu_t(q, {T, H, W});
  Tensor gsl = gq.cols(128, 192);
  Tensor gf = gpu_out({T, H, 64}, DType::kF32);
  gpu->copy(gf, gsl);
  std::vector<float> want(size_t(T) * H * 64);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < 64; ++d) want[(size_t(t) * H + h) * 64 + d] = q[(size_t(t) * H + h) * W + 128 + d];
  EXPECT_EQ(rel_l2(read(gf), want), 0.0);
  Tensor gb = gpu_out({T, H, 576});
  gpu->copy(gb.cols(512, 576), gsl);
  auto got = read(gb);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < 64; ++d)
        ASSERT_EQ(got[(size_t(t) * H + h) * 576 + 512 + d], want[(size_t(t) * H + h) * 64 + d]);

  auto table = rand_bf16(size_t(V) * D);
  std::vector<int32_t> ids(R);
  for (auto& i : ids) i = int(rng()() % V);
  Tensor ce = cpu_t(std::vector<float>(size_t(R) * D), {R, D});
  Tensor cids = Tensor::make(ids.data(), DType::kI32, {R});
  cpu.embedding(ce, cpu_t(table, {V, D}), cids);
  Tensor ge = gpu_out({R, D});
  Tensor gtab = gpu_t(table, {V, D});
  gpu->embedding(ge, gtab, gpu_i32(ids));
  EXPECT_EQ(rel_l2(read(ge), read_cpu(ce)), 0.0);
  Tensor gg = gpu_out({R, D});
  gpu->gather_rows(gg, gtab, gpu_i32(ids));
  EXPECT_EQ(rel_l2(read(gg), read_cpu(ce)), 0.0);
  // Rows of 500 columns (not whole 16-byte pieces): the element-wise gather.
  Tensor gg5 = gpu_out({R, 500});
  gpu->gather_rows(gg5, gtab.cols(0, 500), gpu_i32(ids));
  const auto got5 = read(gg5), all = read_cpu(ce);
  for (int i = 0; i < R; ++i)
    for (int d = 0; d < 500; ++d) ASSERT_EQ(got5[size_t(i) * 500 + d], all[size_t(i) * D + d]);
}

TEST_F(GpuOps, ArgmaxRows) {
  const int R = 5, V = 102400;
  std::vector<float> l(size_t(R) * V);
  for (auto& v : l) v = float(int(rng()() % 2000)) * 0.01f;  // coarse values: many ties
  l[size_t(3) * V + 77] = 1e9f;
  l[size_t(3) * V + 99000] = 1e9f;  // a tie at the maximum: the lowest id wins
  l[size_t(4) * V + 5] = 30.0f;     // 10 above the rest: a probability of ~0.8
  std::vector<int32_t> want(R), got(R);
  std::vector<float> want_p(R), got_p(R);
  cpu.argmax_rows(Tensor::make(want.data(), DType::kI32, {R}), cpu_t(l, {R, V}),
                  Tensor::make(want_p.data(), DType::kF32, {R}));
  Tensor ids = gpu->scratch(DType::kI32, {R}), probs = gpu->scratch(DType::kF32, {R});
  gpu->argmax_rows(ids, gpu_t(l, {R, V}, DType::kF32), Tensor{});
  gpu->copy_to_host(ids, got.data());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[3], 77);
  gpu->argmax_rows(ids, gpu_t(l, {R, V}, DType::kF32), probs);
  gpu->copy_to_host(ids, got.data());
  gpu->copy_to_host(probs, got_p.data());
  EXPECT_EQ(got, want);
  EXPECT_FLOAT_EQ(want_p[3], 0.5f);  // two tied maxima far above the rest
  EXPECT_GT(want_p[4], 0.01f);
  EXPECT_LT(want_p[4], 0.99f);
  for (int r = 0; r < R; ++r)
    EXPECT_NEAR(got_p[size_t(r)], want_p[size_t(r)], 1e-5f * want_p[size_t(r)] + 1e-7f) << r;
}

// head_argmax (the head's GEMV with the argmax folded in: blocks' partial maxima merged by the last
// block) gives the composition's ids (Ops::head_argmax: gather, linear, argmax_rows) and its
// probabilities up to the order of their sums: 1-4 rows the fused kernel (gathered rows or the first
// ones; V 1003 leaves units past V in the last block), 6 rows the composition. Row 0's maximum is a
// tie (two equal head rows): the lowest id wins. Each case runs twice: the arrival counter is back at 0.
TEST_F(GpuOps, HeadArgmaxMatchesComposed) {
  for (auto [V, D, M, gathered] : {std::tuple{8192, 256, 1, false},
                                   {8192, 256, 4, true},
                                   {1003, 256, 3, true},
                                   {8192, 512, 2, false},
                                   {8192, 256, 6, true}}) {
    SCOPED_TRACE(testing::Message() << "V " << V << " D " << D << " M " << M << " gathered " << gathered);
    const int X = M + 2;  // rows of x
    const auto x = rand_bf16(size_t(X) * D);
    auto w = rand_bf16(size_t(V) * D, 0.05f);
    std::vector<int32_t> rows(M);
    for (int r = 0; r < M; ++r) rows[r] = (r * 3 + 2) % X;
    const int r0 = gathered ? rows[0] : 0;
    for (int d = 0; d < D; ++d)  // head rows 7 and V - 3 point along row 0's input: a tied maximum
      w[size_t(7) * D + d] = w[size_t(V - 3) * D + d] =
          bf16_to_f32(f32_to_bf16(0.05f * x[size_t(r0) * D + d]));
    Weight gw;
    gw.w = gpu_t(w, {V, D});
    const Tensor gx = gpu_t(x, {X, D}), grows = gathered ? gpu_i32(rows) : Tensor{};
    Tensor ref_ids = gpu->scratch(DType::kI32, {M}), ref_p = gpu->scratch(DType::kF32, {M});
    gpu->Ops::head_argmax(ref_ids, ref_p, gx, grows, gw);
    const std::vector<int32_t> want = read_i32(ref_ids);
    const std::vector<float> want_p = read(ref_p);
    EXPECT_EQ(want[0], 7);
    for (int rep = 0; rep < 2; ++rep) {
      Tensor ids = gpu->scratch(DType::kI32, {M}), p = gpu->scratch(DType::kF32, {M});
      gpu->head_argmax(ids, p, gx, grows, gw);
      EXPECT_EQ(read_i32(ids), want) << "rep " << rep;
      const std::vector<float> got_p = read(p);
      for (int r = 0; r < M; ++r)
        EXPECT_NEAR(got_p[size_t(r)], want_p[size_t(r)], 1e-5f * want_p[size_t(r)])
            << "rep " << rep << " row " << r;
      Tensor only = gpu->scratch(DType::kI32, {M});
      gpu->head_argmax(only, Tensor{}, gx, grows, gw);  // without the probabilities
      EXPECT_EQ(read_i32(only), want) << "rep " << rep;
    }
  }
}

TEST_F(GpuOps, Rope) {
  for (bool inter : {true, false}) {
    const int T = 9, H = 16, dim = 64, P = 4096;
    std::vector<float> cs(size_t(P) * dim / 2), sn(cs.size());
    for (int p = 0; p < P; ++p)
      for (int i = 0; i < dim / 2; ++i) {
        const float f = std::pow(10000.0f, -2.0f * i / dim);
        cs[size_t(p) * dim / 2 + i] = std::cos(p * f);
        sn[size_t(p) * dim / 2 + i] = std::sin(p * f);
      }
    std::vector<int32_t> pos(T);
    for (auto& p : pos) p = int(rng()() % P);
    auto x = rand_bf16(size_t(T) * H * 192);
    RopeTable ct{cpu_t(cs, {P, dim / 2}), cpu_t(sn, {P, dim / 2}), dim, inter};
    RopeTable gt{gpu_t(cs, {P, dim / 2}, DType::kF32), gpu_t(sn, {P, dim / 2}, DType::kF32), dim, inter};
    Tensor cx = cpu_t(x, {T, H, 192});
    cpu.rope(cx.cols(128, 192), Tensor::make(pos.data(), DType::kI32, {T}), ct);
    Tensor gx = gpu_t(x, {T, H, 192});
    gpu->rope(gx.cols(128, 192), gpu_i32(pos), gt);
    EXPECT_LE(rel_l2(read(gx), read_cpu(cx)), 1e-2) << "interleaved " << inter;
  }
}

// The fused MLA prologue equals the composition of the primitive ops it replaces (Ops' default),
// bit for bit: cache rows (a padding row with slot -1 writes nothing), q_pe in place, and its copy.
// mla_prepare's one kernel against the composed ops (rmsnorm, copy, rope, cache_write), and
// mla_prepare_absorbed (the prologue and q_nope W_UK in one launch for T <= 4) against mla_prepare +
// linear_heads, bit for bit: cache rows, rotated q_pe in place and in q_lat, and q_lat's latent part.
TEST_F(GpuOps, MlaPrepareMatchesComposedOps) {
  const int H = 16, dim = 64, P = 512, r = 512, W = r + dim, blocks = 2, nope = 128;
  const std::vector<int32_t> pos_all = {0, 5, 77, 300, 511, 9}, slots_all = {3, 64, 100, -1, 127, 0};
  const auto wuk = rand_bf16(size_t(H) * r * nope, 0.05f);
  for (int T : {6, 3, 1}) {
    for (bool inter : {true, false}) {
      SCOPED_TRACE(testing::Message() << "T " << T << " interleaved " << inter);
      std::vector<float> cs(size_t(P) * dim / 2), sn(cs.size());
      for (int p = 0; p < P; ++p)
        for (int i = 0; i < dim / 2; ++i) {
          cs[size_t(p) * dim / 2 + i] = std::cos(p * std::pow(10000.0f, -2.0f * i / dim));
          sn[size_t(p) * dim / 2 + i] = std::sin(p * std::pow(10000.0f, -2.0f * i / dim));
        }
      RopeTable rt{gpu_t(cs, {P, dim / 2}, DType::kF32), gpu_t(sn, {P, dim / 2}, DType::kF32), dim, inter};
      const std::vector<int32_t> pos(pos_all.begin(), pos_all.begin() + T),
          slots(slots_all.begin(), slots_all.begin() + T);
      AttnMeta m;
      m.num_tokens = T;
      m.slot_mapping = gpu_i32(slots).ptr<const int32_t>();
      const Tensor gpos = gpu_i32(pos), gwuk = gpu_t(wuk, {H, r, nope});
      const auto kva = rand_bf16(size_t(T) * W), q = rand_bf16(size_t(T) * H * 192), w = rand_bf16(r);
      const auto cache0 = rand_bf16(size_t(blocks) * 64 * W);
      // Modes: 0 mla_prepare, 1 the composed ops, 2 mla_prepare_absorbed, 3 mla_prepare + linear_heads.
      std::vector<float> res[4][3];
      for (int mode = 0; mode < 4; ++mode) {
        Tensor cache = gpu_t(cache0, {blocks, 64, W});
        Tensor gq = gpu_t(q, {T, H, 192});
        Tensor out = gpu_out({T, H, W});
        const Tensor gk = gpu_t(kva, {T, W}), gw = gpu_t(w, {r});
        if (mode == 0) gpu->mla_prepare(cache, gk, gw, 1e-6f, gq.cols(128, 192), out.cols(r, W), gpos, rt, m);
        if (mode == 1)
          gpu->Ops::mla_prepare(cache, gk, gw, 1e-6f, gq.cols(128, 192), out.cols(r, W), gpos, rt, m);
        if (mode == 2)
          gpu->mla_prepare_absorbed(cache, gk, gw, 1e-6f, gq.cols(128, 192), out.cols(r, W), gpos, rt, m,
                                    out.cols(0, r), gq.cols(0, nope), gwuk);
        if (mode == 3)
          gpu->Ops::mla_prepare_absorbed(cache, gk, gw, 1e-6f, gq.cols(128, 192), out.cols(r, W), gpos, rt, m,
                                         out.cols(0, r), gq.cols(0, nope), gwuk);
        res[mode][0] = read(cache);
        res[mode][1] = read(gq);
        res[mode][2] = read(out);
      }
      for (int k = 0; k < 2; ++k) {
        EXPECT_EQ(res[0][k], res[1][k]) << "part " << k;
        EXPECT_EQ(res[2][k], res[0][k]) << "part " << k;
      }
      EXPECT_EQ(res[2][2], res[3][2]) << "q_lat";
      for (int i = 0; i < T * H; ++i)  // the rope columns (modes 0 and 1 write only those)
        EXPECT_TRUE(std::equal(res[0][2].begin() + int64_t(i) * W + r, res[0][2].begin() + int64_t(i + 1) * W,
                               res[1][2].begin() + int64_t(i) * W + r))
            << "q_pe copy, row " << i;
      // Slot 1 is nobody's (the padding row has slot -1): its row keeps the old contents.
      EXPECT_TRUE(std::equal(res[0][0].begin() + W, res[0][0].begin() + 2 * W, cache0.begin() + W));
      EXPECT_FALSE(std::equal(res[0][0].begin() + 3 * W, res[0][0].begin() + 4 * W, cache0.begin() + 3 * W));
    }
  }
}

}  // namespace
}  // namespace beluga
