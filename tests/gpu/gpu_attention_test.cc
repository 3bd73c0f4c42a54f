// GPU tests: the paged KV cache (cache_write, gather_context) and attention (MLA absorbed and
// expanded, GQA) against the CPU backend. Bounds: 2e-2 relative L2 (BF16 outputs, BF16 P in PV).
// Not part of ctest: tests/gpu/run.sh runs test_gpu on a machine with a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <tuple>

#include "gpu_test_support.h"

namespace beluga {
namespace {

using namespace gpu_test;

// ---- attention ----
struct MetaPair {
  AttnMeta cpu, gpu;
  std::vector<int32_t> qs, ctx, table, slots, pos;
  int num_blocks = 0;
};

// Sequences with (context, query) lengths; blocks assigned in a shuffled order (paging).
MetaPair make_meta(CudaOps& gpu, const std::vector<std::pair<int, int>>& seqs, int bs = 64) {
  MetaPair m;
  int max_blocks = 1, total_blocks = 0;
  for (auto [c, q] : seqs) {
    max_blocks = std::max(max_blocks, (c + q + bs - 1) / bs);
    total_blocks += (c + q + bs - 1) / bs;
  }
  std::vector<int> order(total_blocks);
  for (int i = 0; i < total_blocks; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng());
  m.num_blocks = total_blocks;
  m.table.assign(seqs.size() * max_blocks, 0);
  int next = 0, row = 0;
  m.qs.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    auto [c, q] = seqs[s];
    const int nb = (c + q + bs - 1) / bs;
    for (int b = 0; b < nb; ++b) m.table[s * max_blocks + b] = order[next++];
    for (int j = 0; j < q; ++j, ++row) {
      const int p = c + j;
      m.pos.push_back(p);
      m.slots.push_back(m.table[s * max_blocks + p / bs] * bs + p % bs);
    }
    m.qs.push_back(row);
    m.ctx.push_back(c);
  }
  for (AttnMeta* a : {&m.cpu, &m.gpu}) {
    a->num_seqs = int(seqs.size());
    a->num_tokens = row;
    a->max_blocks = max_blocks;
    a->block_size = bs;
    a->h_query_start = m.qs;
    a->h_context_len = m.ctx;
  }
  m.cpu.query_start = m.qs.data();
  m.cpu.context_len = m.ctx.data();
  m.cpu.block_table = m.table.data();
  m.cpu.slot_mapping = m.slots.data();
  m.cpu.positions = m.pos.data();
  auto up = [&](const std::vector<int32_t>& v) {
    Tensor x = gpu.scratch(DType::kI32, {int64_t(std::max<size_t>(v.size(), 1))});
    gpu.copy_from_host(x, v.data());
    return x.ptr<const int32_t>();
  };
  m.gpu.query_start = up(m.qs);
  m.gpu.context_len = up(m.ctx);
  m.gpu.block_table = up(m.table);
  m.gpu.slot_mapping = up(m.slots);
  m.gpu.positions = up(m.pos);
  return m;
}

TEST_F(GpuOps, CacheWriteAndGatherContext) {
  const int W = 576;
  MetaPair m = make_meta(*gpu, {{100, 3}, {0, 70}, {64, 1}});
  const int T = m.cpu.num_tokens, nb = m.num_blocks;
  auto cache0 = rand_bf16(size_t(nb) * 64 * W), e = rand_bf16(size_t(T) * W);
  Tensor cc = cpu_t(cache0, {nb, 64, W});
  cpu.cache_write(cc, cpu_t(e, {T, W}), m.cpu);
  Tensor gc = gpu_t(cache0, {nb, 64, W});
  gpu->cache_write(gc, gpu_t(e, {T, W}), m.gpu);
  EXPECT_EQ(rel_l2(read(gc), read_cpu(cc)), 0.0);
  int C = 0;
  for (int s = 0; s < 3; ++s) C += m.ctx[s] + m.qs[s + 1] - m.qs[s];
  Tensor co = cpu_t(std::vector<float>(size_t(C) * W), {C, W});
  cpu.gather_context(co, cc, m.cpu);
  Tensor go = gpu_out({C, W});
  gpu->gather_context(go, gc, m.gpu);
  EXPECT_EQ(rel_l2(read(go), read_cpu(co)), 0.0);
}

// Absorbed MLA: the tensor-core path (576/512, 16 heads) and the reference path (tiny dims); and
// mla_attention_absorbed_uv, whose W_UV product merges the splits itself for up to 4 tokens (cases 2
// and 3), bit-identical to mla_attention_absorbed + linear_heads.
TEST_F(GpuOps, MlaAbsorbed) {
  struct Case {
    int H, rank, rope;
    bool reference;
    std::vector<std::pair<int, int>> seqs;
  };
  const std::vector<Case> cases = {
      {16, 512, 64, false, {{0, 1}}},      // one split: the kernel writes the output itself
      {16, 512, 64, false, {{700, 1}}},    // 11 one-tile splits (64 keys), merged by the combine step
      {16, 512, 64, false, {{2047, 1}}},   // 2048 keys: 32 one-tile splits, the most that path takes
      {16, 512, 64, false, {{2100, 1}}},   // past 32 tiles: 17 of 32 splits, of 128 keys (by its length)
      {16, 512, 64, false, {{20000, 1}}},  // 128 splits, 105 with keys: lanes take four
      {16, 512, 64, false, {{3000, 1}, {100, 1}}},  // two tokens, each split by its own length
      {16, 512, 64, false, {{1000, 1}, {37, 1}, {4095, 1}, {64, 1}}},
      // 72 tokens x 4 splits of 192 keys: more than two blocks per SM (132 SMs), so single-buffered
      // blocks, two per SM, each through three tiles
      {16, 512, 64, false, std::vector<std::pair<int, int>>(72, {600, 1})},
      {32, 512, 64, false, {{300, 5}, {0, 9}}},  // several query tokens per sequence (causal)
      {16, 512, 64, true, {{300, 2}, {5, 1}}},
      {4, 32, 8, false, {{50, 3}, {0, 4}}},  // falls back to the reference kernel
      {4, 64, 16, false, {{700, 1}}},        // the demo model's shape at batch 1: 22 key splits, merged
  };
  for (const Case& c : cases) {
    gpu->set_reference_attention(c.reference);
    MetaPair m = make_meta(*gpu, c.seqs);
    const int T = m.cpu.num_tokens, W = c.rank + c.rope, nb = m.num_blocks;
    auto cache = rand_bf16(size_t(nb) * 64 * W), q = rand_bf16(size_t(T) * c.H * W);
    const float scale = 0.1147f;
    Tensor co = cpu_t(std::vector<float>(size_t(T) * c.H * c.rank), {T, c.H, c.rank});
    cpu.mla_attention_absorbed(co, cpu_t(q, {T, c.H, W}), cpu_t(cache, {nb, 64, W}), m.cpu, c.rank, scale);
    Tensor go = gpu_out({T, c.H, c.rank});
    gpu->mla_attention_absorbed(go, gpu_t(q, {T, c.H, W}), gpu_t(cache, {nb, 64, W}), m.gpu, c.rank, scale);
    EXPECT_LE(rel_l2(read(go), read_cpu(co)), 2e-2)
        << "H " << c.H << " rank " << c.rank << " ref " << c.reference << " seqs " << c.seqs.size();
    // Again: the split blocks' arrival counters must be back at zero, and the merge order fixed.
    Tensor go2 = gpu_out({T, c.H, c.rank});
    gpu->mla_attention_absorbed(go2, gpu_t(q, {T, c.H, W}), gpu_t(cache, {nb, 64, W}), m.gpu, c.rank, scale);
    EXPECT_EQ(read(go2), read(go)) << "second run differs, seqs " << c.seqs.size();

    const int v = 128;
    const Tensor wuv = gpu_t(rand_bf16(size_t(c.H) * v * c.rank, 0.05f), {c.H, v, c.rank});
    Tensor ref = gpu_out({T, c.H, v}), uv = gpu_out({T, c.H, v});
    gpu->linear_heads(ref, go, wuv);
    gpu->mla_attention_absorbed_uv(uv, gpu_t(q, {T, c.H, W}), gpu_t(cache, {nb, 64, W}), m.gpu, c.rank, scale,
                                   wuv);
    EXPECT_EQ(read(uv), read(ref)) << "W_UV, seqs " << c.seqs.size();
  }
  gpu->set_reference_attention(false);
}

// --deterministic's absorbed MLA (CudaOptions::deterministic): a probe token over 701 keys gives the
// same output bits alone, beside sequences whose lengths would pick other split counts (20000 keys,
// 37 keys, 72 tokens of 600), and as the last row of a causal chunk over the same keys; through
// mla_attention_absorbed_uv too (its W_UV as its own per-head product). The cache holds the same
// values at the probe's positions in every layout (pages shuffled differently each time).
TEST_F(GpuOps, DeterministicMlaDecodeDoesNotDependOnTheBatch) {
  CudaOptions o;
  o.deterministic = true;
  CudaOps det(o);
  det.set_deterministic_keys(32768);
  const int H = 16, R = 512, W = 576, kProbeKeys = 701;
  const float scale = 0.1147f;
  auto val = [](uint32_t seq, uint32_t pos, uint32_t d) {  // BF16-exact values in [-1, 1)
    uint32_t h = seq * 2654435761u ^ pos * 40503u ^ d * 2246822519u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    return bf16_to_f32(f32_to_bf16(float(h & 0xffff) / 32768.0f - 1.0f));
  };
  const std::vector<float> wuv = rand_bf16(size_t(H) * 128 * R, 0.05f);
  std::vector<uint16_t> wb(wuv.size());
  for (size_t i = 0; i < wuv.size(); ++i) wb[i] = f32_to_bf16(wuv[i]);
  const Tensor w16 = det.upload(Tensor::make(wb.data(), DType::kBF16, {H, 128, R}));
  // Runs `seqs` (probe: sequence `probe`, its last query token), returns the probe token's latent and
  // W_UV outputs as raw bits.
  auto run = [&](const std::vector<std::pair<int, int>>& seqs, int probe) {
    MetaPair m = make_meta(det, seqs);
    const int T = m.cpu.num_tokens, nb = m.num_blocks;
    std::vector<float> cache(size_t(nb) * 64 * W), q(size_t(T) * H * W);
    for (size_t sq = 0; sq < seqs.size(); ++sq) {
      const uint32_t tag = int(sq) == probe ? 7u : 100u + uint32_t(sq);
      const int n = seqs[sq].first + seqs[sq].second, mb = m.cpu.max_blocks;
      for (int p = 0; p < n; ++p) {
        const int slot = m.table[sq * size_t(mb) + p / 64] * 64 + p % 64;
        for (int d = 0; d < W; ++d) cache[size_t(slot) * W + d] = val(tag, uint32_t(p), uint32_t(d));
      }
      for (int t = m.qs[sq]; t < m.qs[sq + 1]; ++t)
        for (int h = 0; h < H; ++h)
          for (int d = 0; d < W; ++d)
            q[(size_t(t) * H + h) * W + d] =
                val(tag + 1000u, uint32_t(m.pos[size_t(t)]), uint32_t(h * W + d));
    }
    Tensor gc = det.scratch(DType::kBF16, {nb, 64, W});
    Tensor gq = det.scratch(DType::kBF16, {T, H, W});
    std::vector<uint16_t> b(cache.size());
    for (size_t i = 0; i < cache.size(); ++i) b[i] = f32_to_bf16(cache[i]);
    det.copy_from_host(gc, b.data());
    b.resize(q.size());
    for (size_t i = 0; i < q.size(); ++i) b[i] = f32_to_bf16(q[i]);
    det.copy_from_host(gq, b.data());
    Tensor lat = det.scratch(DType::kBF16, {T, H, R}), uv = det.scratch(DType::kBF16, {T, H, 128});
    det.mla_attention_absorbed(lat, gq, gc, m.gpu, R, scale);
    det.mla_attention_absorbed_uv(uv, gq, gc, m.gpu, R, scale, w16);
    std::vector<uint16_t> hl(size_t(T) * H * R), hu(size_t(T) * H * 128);
    det.copy_to_host(lat, hl.data());
    det.copy_to_host(uv, hu.data());
    const int t = m.qs[size_t(probe) + 1] - 1;
    std::vector<uint16_t> out(hl.begin() + int64_t(t) * H * R, hl.begin() + int64_t(t + 1) * H * R);
    out.insert(out.end(), hu.begin() + int64_t(t) * H * 128, hu.begin() + int64_t(t + 1) * H * 128);
    det.reset_scratch();
    return out;
  };
  const std::vector<uint16_t> alone = run({{kProbeKeys - 1, 1}}, 0);
  EXPECT_EQ(run({{20000, 1}, {kProbeKeys - 1, 1}, {37, 1}}, 1), alone) << "beside 20000 and 37 keys";
  std::vector<std::pair<int, int>> many(72, {600, 1});
  many.push_back({kProbeKeys - 1, 1});
  EXPECT_EQ(run(many, 72), alone) << "after 72 tokens of 600 keys";
  EXPECT_EQ(run({{kProbeKeys - 5, 5}, {3000, 1}}, 0), alone) << "last row of a 5-token causal chunk";
}

// A kernel's permission to use more than 48 KB of dynamic shared memory belongs to a device: a CudaOps
// on the second GPU of a process must run the MLA decode (175 KB) after one on the first GPU did (a
// process-wide "configured" flag once left the second device's launch failing). Needs two GPUs.
TEST_F(GpuOps, EachDeviceRunsLargeSharedMemoryKernels) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) GTEST_SKIP() << "needs two CUDA devices";
  const int H = 16, rank = 512, W = 576;
  std::vector<float> ref_out;
  for (int device = 0; device < 2; ++device) {
    if (device > 0) {
      CudaOptions o;
      o.device = device;
      gpu.reset();  // freed on its own device; the process keeps whatever it set for device 0
      gpu = std::make_unique<CudaOps>(o);
    }
    std::mt19937_64 r(7);  // the same inputs on both devices
    std::swap(r, rng());
    MetaPair m = make_meta(*gpu, {{700, 1}});
    const int T = m.cpu.num_tokens, nb = m.num_blocks;
    auto cache = rand_bf16(size_t(nb) * 64 * W), q = rand_bf16(size_t(T) * H * W);
    std::swap(r, rng());
    Tensor go = gpu_out({T, H, rank});
    gpu->mla_attention_absorbed(go, gpu_t(q, {T, H, W}), gpu_t(cache, {nb, 64, W}), m.gpu, rank, 0.1147f);
    if (device == 0) {
      Tensor co = cpu_t(std::vector<float>(size_t(T) * H * rank), {T, H, rank});
      cpu.mla_attention_absorbed(co, cpu_t(q, {T, H, W}), cpu_t(cache, {nb, 64, W}), m.cpu, rank, 0.1147f);
      ref_out = read_cpu(co);
    }
    EXPECT_LE(rel_l2(read(go), ref_out), 2e-2) << "device " << device;
  }
}

TEST_F(GpuOps, MlaExpanded) {
  struct Case {
    int H, nope, rope, v;
    bool reference;
    std::vector<std::pair<int, int>> seqs;
  };
  const std::vector<Case> cases = {
      {16, 128, 64, 128, false, {{0, 200}}},
      {16, 128, 64, 128, false, {{130, 77}, {0, 64}, {5, 1}}},  // cached prefix + new chunk, varlen
      {16, 128, 64, 128, false, {{300, 700}, {0, 129}}},        // several 128-query blocks and key tiles
      {16, 128, 64, 128, false, {{0, 1100}}},  // 96 blocks on an H200: the longest run as two halves
      {8, 128, 64, 128, true, {{20, 40}}},
      {4, 16, 8, 16, false, {{10, 20}, {0, 5}}},  // reference kernel
  };
  for (const Case& c : cases) {
    gpu->set_reference_attention(c.reference);
    MetaPair m = make_meta(*gpu, c.seqs);
    const int T = m.cpu.num_tokens, Dq = c.nope + c.rope;
    int C = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s) C += c.seqs[s].first + c.seqs[s].second;
    auto q = rand_bf16(size_t(T) * c.H * Dq), kv = rand_bf16(size_t(C) * c.H * (c.nope + c.v)),
         ctx = rand_bf16(size_t(C) * (512 + c.rope));
    const float scale = 1.0f / std::sqrt(float(Dq));
    Tensor co = cpu_t(std::vector<float>(size_t(T) * c.H * c.v), {T, c.H, c.v});
    cpu.mla_attention_expanded(co, cpu_t(q, {T, c.H, Dq}), cpu_t(kv, {C, c.H, c.nope + c.v}),
                               cpu_t(ctx, {C, 512 + c.rope}).cols(512, 512 + c.rope), m.cpu, scale);
    const Tensor gq = gpu_t(q, {T, c.H, Dq}), gkv = gpu_t(kv, {C, c.H, c.nope + c.v}),
                 gpe = gpu_t(ctx, {C, 512 + c.rope}).cols(512, 512 + c.rope);
    Tensor go = gpu_out({T, c.H, c.v});
    gpu->mla_attention_expanded(go, gq, gkv, gpe, m.gpu, scale);
    const std::vector<float> got = read(go);
    EXPECT_LE(rel_l2(got, read_cpu(co)), 2e-2) << "H " << c.H << " nope " << c.nope << " ref " << c.reference;
    // The same bits again: split query blocks are merged by whichever half finishes second.
    for (int rep = 0; rep < 3; ++rep) {
      Tensor again = gpu_out({T, c.H, c.v});
      gpu->mla_attention_expanded(again, gq, gkv, gpe, m.gpu, scale);
      const std::vector<float> b = read(again);
      EXPECT_EQ(0, std::memcmp(b.data(), got.data(), got.size() * sizeof(float)))
          << "H " << c.H << " seqs " << c.seqs.size() << " repeat " << rep;
    }
  }
  gpu->set_reference_attention(false);
}

// GQA on the reference kernel (a block per KV head for its group of 4, 2 or 8 query heads), its keys
// split over blocks where the grid would not fill the GPU: one split (38 tokens), a batch-1 decode over
// 2000 keys (split in 32-key chunks, merged by the last split to finish), and sequences whose tokens use
// different numbers of a step's splits. Twice each: the same bits.
TEST_F(GpuOps, GqaAttention) {
  const std::vector<std::vector<std::pair<int, int>>> cases = {
      {{90, 1}, {0, 33}, {200, 4}}, {{2000, 1}}, {{700, 1}, {30, 2}, {0, 3}}};
  for (const auto& [H, KVH, D] :
       std::vector<std::tuple<int, int, int>>{{8, 2, 64}, {8, 4, 128}, {16, 2, 128}})
    for (const auto& seqs : cases) {
      MetaPair m = make_meta(*gpu, seqs);
      const int T = m.cpu.num_tokens, nb = m.num_blocks, W = 2 * KVH * D;
      auto cache = rand_bf16(size_t(nb) * 64 * W), q = rand_bf16(size_t(T) * H * D);
      Tensor co = cpu_t(std::vector<float>(size_t(T) * H * D), {T, H, D});
      cpu.gqa_attention(co, cpu_t(q, {T, H, D}), cpu_t(cache, {nb, 64, W}), m.cpu, KVH, 0.125f);
      Tensor go = gpu_out({T, H, D});
      gpu->gqa_attention(go, gpu_t(q, {T, H, D}), gpu_t(cache, {nb, 64, W}), m.gpu, KVH, 0.125f);
      EXPECT_LE(rel_l2(read(go), read_cpu(co)), 2e-2)
          << "heads " << H << " / " << KVH << " x " << D << ", first sequence's keys " << seqs[0].first;
      // Again: the last split of each (token, KV head) merged them, and put its counter back to zero.
      Tensor go2 = gpu_out({T, H, D});
      gpu->gqa_attention(go2, gpu_t(q, {T, H, D}), gpu_t(cache, {nb, 64, W}), m.gpu, KVH, 0.125f);
      EXPECT_EQ(read(go2), read(go)) << "second run differs, first sequence's keys " << seqs[0].first;
    }
}

}  // namespace
}  // namespace beluga
