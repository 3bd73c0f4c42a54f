// Mixture of experts on the GPU: routing (softmax/sigmoid, bias for selection, group-limited top-k),
// for a few tokens fused with the router GEMV into one kernel, a device-side plan that groups token
// rows by expert, one grouped GEMM launch for gate+up (with SiLU-and-mul in its epilogue) and one for
// down over all experts at once, and a combine step. Tile schedules are computed on the device, so
// nothing waits for the host.
#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

bool capturing(cudaStream_t st) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  BELUGA_CUDA_CHECK(cudaStreamIsCapturing(st, &status));
  return status != cudaStreamCaptureStatusNone;
}

// ---- routing: one warp per token ----
struct RouteArgs {
  const float* logits;
  int64_t ldl;
  const void* bias;
  bool bias_f32;
  int32_t* ids;
  float* weights;
  int T, E, K, G, topk_group;
  bool softmax, top2_sum, norm;
  float scaling;
};

__device__ __forceinline__ bool better(float v1, int i1, float v2, int i2) {
  return v1 > v2 || (v1 == v2 && i1 < i2);
}

__device__ __forceinline__ void warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) {
      v = ov;
      i = oi;
    }
  }
}

// Routes token t with the calling warp; s: [2 E] floats of shared memory for the warp. Logits are read
// from L2 (__ldcg): the fused gate kernel reads logits that other blocks of its grid wrote.
__device__ void route_token(const RouteArgs& a, int t, float* s) {
  const int lane = threadIdx.x & 31;
  float* sel = s + a.E;
  const float* z = a.logits + int64_t(t) * a.ldl;
  if (a.softmax) {
    float mx = -INFINITY;
    for (int e = lane; e < a.E; e += 32) mx = fmaxf(mx, __ldcg(z + e));
    mx = warp_max(mx);
    float sum = 0;
    for (int e = lane; e < a.E; e += 32) sum += (s[e] = expf(__ldcg(z + e) - mx));
    sum = warp_sum(sum);
    for (int e = lane; e < a.E; e += 32) s[e] /= sum;
  } else {
    for (int e = lane; e < a.E; e += 32) s[e] = 1.0f / (1.0f + expf(-__ldcg(z + e)));
  }
  for (int e = lane; e < a.E; e += 32) {
    float b = 0;
    if (a.bias)
      b = a.bias_f32 ? static_cast<const float*>(a.bias)[e] : to_f(static_cast<const bf16*>(a.bias)[e]);
    sel[e] = s[e] + b;
  }
  __syncwarp();
  if (a.G > 1) {
    const int per = a.E / a.G;
    float gs = -INFINITY;
    for (int g = lane; g < a.G; g += 32) {  // G <= 32 in practice; a lane may own several groups
      const float* b = sel + g * per;
      float m1 = -INFINITY, m2 = -INFINITY;
      for (int i = 0; i < per; ++i) {
        if (b[i] > m1) {
          m2 = m1;
          m1 = b[i];
        } else if (b[i] > m2) {
          m2 = b[i];
        }
      }
      gs = a.top2_sum ? (per > 1 ? m1 + m2 : m1) : m1;
    }
    unsigned keep = 0;  // bit g: group g kept (G <= 32)
    bool picked = false;
    for (int k = 0; k < a.topk_group; ++k) {
      float v = (lane < a.G && !picked) ? gs : -INFINITY;
      int i = (lane < a.G && !picked) ? lane : INT_MAX;
      warp_argmax(v, i);
      keep |= 1u << i;
      if (lane == i) picked = true;
    }
    __syncwarp();
    for (int e = lane; e < a.E; e += 32)
      if (!((keep >> (e / per)) & 1u)) sel[e] = -INFINITY;
    __syncwarp();
  }
  unsigned taken = 0;  // bit j: element lane + 32 j already chosen
  float wsum = 0;
  for (int k = 0; k < a.K; ++k) {
    float v = -INFINITY;
    int idx = INT_MAX;
    for (int j = 0, e = lane; e < a.E; ++j, e += 32)
      if (!((taken >> j) & 1u) && better(sel[e], e, v, idx)) {
        v = sel[e];
        idx = e;
      }
    warp_argmax(v, idx);
    if ((idx & 31) == lane) taken |= 1u << (idx >> 5);
    const float w = s[idx];
    wsum += w;
    if (lane == 0) {
      a.ids[int64_t(t) * a.K + k] = idx;
      a.weights[int64_t(t) * a.K + k] = w;
    }
  }
  __syncwarp();
  if (lane == 0)
    for (int k = 0; k < a.K; ++k) {
      float w = a.weights[int64_t(t) * a.K + k];
      if (a.norm) w /= (wsum + 1e-20f);
      a.weights[int64_t(t) * a.K + k] = w * a.scaling;
    }
}

__global__ void moe_route_kernel(RouteArgs a) {
  pdl_entry();
  extern __shared__ float sm[];
  const int wib = threadIdx.x >> 5;
  const int t = blockIdx.x * (blockDim.x >> 5) + wib;
  if (t >= a.T) return;
  route_token(a, t, sm + size_t(wib) * 2 * a.E);
}

// ---- plan: rows grouped by expert ----
// start[e]: first row of expert e; tile_start[e]: first BM-row tile; row_token[r]: token of row r;
// entry_row[t*K+i]: row of (token t, choice i). The shared expert (index E) takes every token.
// One block builds it; `cnt` is 2 ne ints of shared memory. ids are read past L1: the fused gate
// builds the plan from ids that other blocks wrote.
__device__ void build_plan(const int32_t* ids, int T, int K, int E, int ne, int bm, int* start,
                           int* tile_start, int* row_token, int* entry_row, int* cnt) {
  int* fill = cnt + ne;
  for (int e = threadIdx.x; e < ne; e += blockDim.x) cnt[e] = e < E ? 0 : T;
  __syncthreads();
  const int n = T * K;
  for (int i = threadIdx.x; i < n; i += blockDim.x) atomicAdd(&cnt[__ldcg(ids + i)], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int s = 0, ts = 0;
    for (int e = 0; e < ne; ++e) {
      start[e] = s;
      tile_start[e] = ts;
      fill[e] = s;
      s += cnt[e];
      ts += (cnt[e] + bm - 1) / bm;
    }
    start[ne] = s;
    tile_start[ne] = ts;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int slot = atomicAdd(&fill[__ldcg(ids + i)], 1);
    row_token[slot] = i / K;
    entry_row[i] = slot;
  }
  if (ne > E)
    for (int t = threadIdx.x; t < T; t += blockDim.x) row_token[n + t] = t;
}

__global__ void moe_plan_kernel(const int32_t* ids, int T, int K, int E, int ne, int bm, int* start,
                                int* tile_start, int* row_token, int* entry_row) {
  pdl_entry();
  extern __shared__ int cnt[];  // [ne] counts, then [ne] fill cursors
  build_plan(ids, T, K, E, ne, bm, start, tile_start, row_token, entry_row, cnt);
}

// Where the fused gate leaves its plan: laid out for E routed experts plus a shared one (which
// moe_experts ignores when it has none: routed experts' entries are the same either way).
struct GatePlanLayout {
  int64_t start, tile_start, row_token, entry_row, total;
  __host__ __device__ GatePlanLayout(int T, int K, int E)
      : start(0),
        tile_start(E + 2),
        row_token(2 * (E + 2)),
        entry_row(row_token + int64_t(T) * K + T),
        total(entry_row + int64_t(T) * K) {}
};
constexpr int kGatePlanBm = 32;  // the grouped kernel's tile for T <= kGateMaxT (small tiles)

// ---- router GEMV + routing in one kernel (decode) ----
// Block (e, g) dots router row e with the kGateTok token rows of group g: its warps split D, and the
// per-warp sums are added in a fixed order, so the logits do not depend on scheduling. Each block then
// counts itself in on the group's counter; the last one of the group, seeing every logit of its
// tokens, routes them (one warp per token) and puts the counter back to 0 for the next call.
constexpr int kGateThreads = 256, kGateWarps = kGateThreads / 32, kGateTok = kGateWarps, kGateLoads = 4;
// Up to 4 groups: beyond 32 tokens a tensor-core GEMM that reuses each weight tile across many rows
// beats re-streaming the router per 8 tokens, and the route kernel spreads the tokens over more SMs
// than the groups' last blocks. E <= 512 keeps the routing scratch (kGateWarps x 2E floats) in 32 KB.
constexpr int kGateMaxT = 32, kGateMaxE = 512;
constexpr int kGateCounters = kGateMaxT / kGateTok;  // one per token group

// Thread 0 of a block, between two __syncthreads(): counts the block in and returns the count before.
// Release: the block's writes before the barrier are visible to whoever sees the count; acquire: the
// writes of the blocks counted before are visible to this block after the second barrier.
__device__ __forceinline__ int arrive(int* counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

struct GateArgs {
  const bf16* x;
  int64_t ldx;
  const bf16* w;  // [E, D]
  int K8;         // D / 8
  float* logits;  // F32 [T, E] scratch; r.logits points to it
  int* counters;  // [kGateCounters + 1]: per token group, then the groups that have routed
  int* plan;      // GatePlanLayout(T, K, E)
  RouteArgs r;
};

__global__ void __launch_bounds__(kGateThreads) moe_gate_kernel(GateArgs g) {
  extern __shared__ float gate_sm[];  // routing scratch: [kGateWarps][2 E]
  __shared__ float red[kGateWarps][kGateTok];
  __shared__ bool s_last;
  const int e = blockIdx.x, E = g.r.E;
  const bf16* wr = g.w + int64_t(e) * g.K8 * 8;
  pdl_entry();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t0 = blockIdx.y * kGateTok, nt = min(kGateTok, g.r.T - t0);
  float acc[kGateTok] = {};
  for (int c0 = threadIdx.x; c0 < g.K8; c0 += kGateThreads * kGateLoads) {
    uint4 wv[kGateLoads];
#pragma unroll
    for (int j = 0; j < kGateLoads; ++j) {
      const int c = c0 + j * kGateThreads;
      wv[j] = c < g.K8 ? ld_stream(wr + c * 8) : uint4{};
    }
#pragma unroll
    for (int j = 0; j < kGateLoads; ++j) {
      const int c = c0 + j * kGateThreads;
      if (c >= g.K8) break;
#pragma unroll
      for (int r = 0; r < kGateTok; ++r)
        if (r < nt) acc[r] += dot8(wv[j], __ldg(reinterpret_cast<const uint4*>(g.x + (t0 + r) * g.ldx) + c));
    }
  }
#pragma unroll
  for (int r = 0; r < kGateTok; ++r) {
    if (r >= nt) break;
    const float v = warp_sum(acc[r]);
    if (lane == 0) red[warp][r] = v;
  }
  __syncthreads();
  if (threadIdx.x < nt) {
    float z = 0;
    for (int w = 0; w < kGateWarps; ++w) z += red[w][threadIdx.x];
    g.logits[int64_t(t0 + threadIdx.x) * E + e] = z;
  }
  __syncthreads();
  if (threadIdx.x == 0) s_last = arrive(&g.counters[blockIdx.y]) == int(gridDim.x) - 1;
  __syncthreads();
  if (!s_last) return;
  if (warp < nt) route_token(g.r, t0 + warp, gate_sm + size_t(warp) * 2 * E);
  // Every block of the group has arrived, and the next kernel reading this slot starts after this
  // grid completes: a plain store resets it.
  if (threadIdx.x == 0) g.counters[blockIdx.y] = 0;
  // The last group to finish routing plans the experts' rows for moe_experts (saves its plan kernel).
  __syncthreads();
  if (threadIdx.x == 0) s_last = arrive(&g.counters[kGateCounters]) == int(gridDim.y) - 1;
  __syncthreads();
  if (!s_last) return;
  const GatePlanLayout L(g.r.T, g.r.K, E);
  build_plan(g.r.ids, g.r.T, g.r.K, E, E + 1, kGatePlanBm, g.plan + L.start, g.plan + L.tile_start,
             g.plan + L.row_token, g.plan + L.entry_row, reinterpret_cast<int*>(gate_sm));
  if (threadIdx.x == 0) g.counters[kGateCounters] = 0;
}

// ---- grouped GEMM over experts (mma.sync m16n8k16, BF16 in, F32 accumulate) ----
struct GroupedArgs {
  const bf16* a;
  int64_t lda;
  const int* row_token;  // gate-up: A row r is token row_token[r]; down: A row r is row r
  const void* const* ptrs;
  const int* inter;
  const int* start;
  const int* tile_start;
  int ne, D;
  void* out;
  int64_t ldo;
};

constexpr int kBN = 128, kBK = 32, kLdS = kBK + 8, kStages = 5, kThreads = 256;

template <int BM>
constexpr int grouped_smem() {
  return kStages * (BM + kBN) * kLdS * 2;
}

// kGateUp: the 128-row weight tile holds 64 hidden units as [gate 16 | up 16] x 4 (one group per warp
// column), so each thread has gate and up of the same unit and writes silu(g) * u (BF16 [R, I]).
// Otherwise: down projection, F32 [R, D].
template <int BM, bool kGateUp>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(GroupedArgs p) {
  pdl_entry();
  constexpr int WM = BM / 2, MT = WM / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* As = reinterpret_cast<bf16*>(smem_raw);
  bf16* Bs = As + kStages * BM * kLdS;
  const int tile = blockIdx.y;
  const int total = p.tile_start[p.ne];
  if (tile >= total) return;
  int lo = 0, hi = p.ne - 1;  // the largest e with tile_start[e] <= tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (p.tile_start[mid] <= tile)
      lo = mid;
    else
      hi = mid - 1;
  }
  const int e = lo;
  const int m0 = p.start[e] + (tile - p.tile_start[e]) * BM, m_end = p.start[e + 1];
  const int I = p.inter[e];
  const int K = kGateUp ? p.D : I;
  const int Nout = kGateUp ? I : p.D;
  const int n0 = blockIdx.x * (kGateUp ? kBN / 2 : kBN);
  if (n0 >= Nout) return;
  const bf16* w0 = static_cast<const bf16*>(p.ptrs[(kGateUp ? 0 : 2) * p.ne + e]);
  const bf16* w1 = kGateUp ? static_cast<const bf16*>(p.ptrs[p.ne + e]) : nullptr;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  const int KT = (K + kBK - 1) / kBK;

  auto load = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    bf16* as = As + stage * BM * kLdS;
    bf16* bs = Bs + stage * kBN * kLdS;
    for (int c = tid; c < BM * 4; c += kThreads) {
      const int row = c >> 2, part = c & 3, r = m0 + row, k = k0 + part * 8;
      const bool ok = r < m_end && k < K;
      const bf16* src = p.a;
      if (ok) src = p.a + (kGateUp ? int64_t(p.row_token[r]) : int64_t(r)) * p.lda + k;
      cp_async16(as + row * kLdS + part * 8, src, ok);
    }
    for (int c = tid; c < kBN * 4; c += kThreads) {
      const int rr = c >> 2, part = c & 3, k = k0 + part * 8;
      const bf16* base;
      int idx;
      if (kGateUp) {
        const int w = rr & 31;
        idx = n0 + (rr >> 5) * 16 + (w & 15);
        base = w < 16 ? w0 : w1;
      } else {
        idx = n0 + rr;
        base = w0;
      }
      const bool ok = idx < Nout && k < K;
      cp_async16(bs + rr * kLdS + part * 8, ok ? base + int64_t(idx) * K + k : w0, ok);
    }
  };

  float acc[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const int nk = kt + kStages - 1;
    if (nk < KT) load(nk % kStages, nk);
    cp_async_commit();
    const bf16* as = As + (kt % kStages) * BM * kLdS;
    const bf16* bs = Bs + (kt % kStages) * kBN * kLdS;
#pragma unroll
    for (int k16 = 0; k16 < kBK / 16; ++k16) {
      uint32_t af[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
        ldsm_x4(af[mt], as + (wm * WM + mt * 16 + (lane & 15)) * kLdS + k16 * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        uint32_t bfr[4];
        ldsm_x4(bfr, bs + (wn * 32 + np * 16 + (lane & 7) + (lane >> 4) * 8) * kLdS + k16 * 16 +
                         ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_bf16(acc[mt][2 * np], af[mt], bfr[0], bfr[1]);
          mma_bf16(acc[mt][2 * np + 1], af[mt], bfr[2], bfr[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + wm * WM + mt * 16 + g + half * 8;
      if (r >= m_end) continue;
      if (kGateUp) {
        bf16* o = static_cast<bf16*>(p.out) + int64_t(r) * p.ldo;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int col = n0 + wn * 16 + nt * 8 + 2 * t4 + q;
            const float gv = acc[mt][nt][half * 2 + q], uv = acc[mt][nt + 2][half * 2 + q];
            if (col < Nout) o[col] = __float2bfloat16(gv / (1.0f + __expf(-gv)) * uv);
          }
      } else {
        float* o = static_cast<float*>(p.out) + int64_t(r) * p.ldo;
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int col = n0 + wn * 32 + nt * 8 + 2 * t4 + q;
            if (col < Nout) o[col] = acc[mt][nt][half * 2 + q];
          }
      }
    }
}

__global__ void moe_combine_kernel(bf16* out, int64_t ldo, const float* Y, int D, const int* entry_row,
                                   const float* w, int T, int K, int shared_row0) {
  pdl_entry();
  const int64_t n = int64_t(T) * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(i / D), d = int(i % D);
    float acc = 0;
    for (int k = 0; k < K; ++k)
      acc += w[int64_t(t) * K + k] * Y[int64_t(entry_row[int64_t(t) * K + k]) * D + d];
    if (shared_row0 >= 0) acc += Y[int64_t(shared_row0 + t) * D + d];
    out[int64_t(t) * ldo + d] = __float2bfloat16(acc);
  }
}

// ---- decode path: GEMV over the experts that have rows ----
// With a few rows per expert the tensor-core tiles are mostly padding and too few blocks stream the
// weights; here every warp streams whole weight rows (16-byte loads, no L1 allocation) and applies
// each to up to kGvRows token rows staged in shared memory. Block y works on the y-th expert that
// has rows (grid.y = min(rows, experts)), block x on kGvUnits output units of it.
constexpr int kGvThreads = 256, kGvRows = 4;
// Output units per block and 16-byte loads in flight per lane and matrix. A warp's units run one after
// another, so per-warp latency bounds these kernels; measured (ncu, V2-Lite b=1): gate-up best at
// 32 units / 4 loads (two matrices in flight), down (K = 1408: one round trip) at 16 units / 8 loads.
template <bool kGateUp>
constexpr int kGvUnits = kGateUp ? 32 : 16;
template <bool kGateUp>
constexpr int kGvLoads = kGateUp ? 4 : 8;

struct GemvArgs {
  const bf16* x;
  int64_t ldx;
  const int* row_token;  // gate-up: x row of plan row r; down: null (row r of x)
  const void* const* ptrs;
  const int* inter;
  const int* start;
  int ne, D;
  void* out;
  int64_t ldo;
};

template <bool kGateUp>
__global__ void __launch_bounds__(kGvThreads) moe_gemv_kernel(GemvArgs p) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char gv_smem[];
  bf16* xs = reinterpret_cast<bf16*>(gv_smem);  // [kGvRows, K]
  __shared__ int s_expert;
  if (threadIdx.x < 32) {  // the blockIdx.y-th expert with rows: a ballot scan, 32 experts at a time
    const int lane = threadIdx.x;
    int want = blockIdx.y, e = -1;
    for (int base = 0; base < p.ne && e < 0; base += 32) {
      const int i = base + lane;
      const unsigned mask = __ballot_sync(0xffffffffu, i < p.ne && p.start[i + 1] > p.start[i]);
      const int cnt = __popc(mask);
      if (want < cnt) {
        unsigned m = mask;
        for (int j = 0; j < want; ++j) m &= m - 1;  // drop the lower set bits
        e = base + __ffs(int(m)) - 1;
      } else {
        want -= cnt;
      }
    }
    if (lane == 0) s_expert = e;
  }
  __syncthreads();
  const int e = s_expert;
  if (e < 0) return;
  const int I = p.inter[e];
  const int K = kGateUp ? p.D : I;
  const int N = kGateUp ? I : p.D;
  const int u0 = blockIdx.x * kGvUnits<kGateUp>;
  if (u0 >= N) return;
  const int r0 = p.start[e], r1 = p.start[e + 1], K8 = K / 8;
  const bf16* w0 = static_cast<const bf16*>(p.ptrs[(kGateUp ? 0 : 2) * p.ne + e]);
  const bf16* w1 = kGateUp ? static_cast<const bf16*>(p.ptrs[p.ne + e]) : w0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int rg = r0; rg < r1; rg += kGvRows) {
    const int nr = min(kGvRows, r1 - rg);
    __syncthreads();  // the previous group's rows are no longer read
    for (int c = threadIdx.x; c < nr * K8; c += kGvThreads) {
      const int rr = c / K8, part = c % K8;
      const int64_t src = kGateUp ? int64_t(p.row_token[rg + rr]) : int64_t(rg + rr);
      reinterpret_cast<uint4*>(xs + rr * K)[part] = reinterpret_cast<const uint4*>(p.x + src * p.ldx)[part];
    }
    __syncthreads();
    for (int u = u0 + warp; u < min(u0 + kGvUnits<kGateUp>, N); u += kGvThreads / 32) {
      float ag[kGvRows] = {}, au[kGvRows] = {};
      const bf16* wg = w0 + int64_t(u) * K;
      const bf16* wu = w1 + int64_t(u) * K;
      constexpr int U = kGvLoads<kGateUp>;
      for (int k0 = lane; k0 < K8; k0 += 32 * U) {
        uint4 g[U], up[U];
#pragma unroll
        for (int j = 0; j < U; ++j) {
          const bool ok = k0 + 32 * j < K8;
          g[j] = ok ? ld_stream(wg + (k0 + 32 * j) * 8) : uint4{};
          if (kGateUp) up[j] = ok ? ld_stream(wu + (k0 + 32 * j) * 8) : uint4{};
        }
#pragma unroll
        for (int j = 0; j < U; ++j) {
          const int k8 = k0 + 32 * j;
          if (k8 >= K8) break;
#pragma unroll
          for (int r = 0; r < kGvRows; ++r)
            if (r < nr) {
              const uint4 xv = reinterpret_cast<const uint4*>(xs + r * K)[k8];
              ag[r] += dot8(g[j], xv);
              if (kGateUp) au[r] += dot8(up[j], xv);
            }
        }
      }
#pragma unroll
      for (int r = 0; r < kGvRows; ++r) {
        if (r >= nr) break;
        const float gv = warp_sum(ag[r]);
        if (kGateUp) {
          const float uv = warp_sum(au[r]);
          if (lane == 0)
            static_cast<bf16*>(p.out)[int64_t(rg + r) * p.ldo + u] =
                __float2bfloat16(gv / (1.0f + __expf(-gv)) * uv);
        } else if (lane == 0) {
          static_cast<float*>(p.out)[int64_t(rg + r) * p.ldo + u] = gv;
        }
      }
    }
  }
}

template <bool G>
void launch_gemv(const GemvArgs& a, int k_max, int grid_x, int grid_y, cudaStream_t st) {
  const int smem = kGvRows * k_max * 2;
  static int configured = 48 << 10;  // the default dynamic shared memory limit
  if (smem > configured) {
    BELUGA_CUDA_CHECK(
        cudaFuncSetAttribute(moe_gemv_kernel<G>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = smem;
  }
  launch(moe_gemv_kernel<G>, dim3(grid_x, grid_y), kGvThreads, smem, st, a);
  BELUGA_LAUNCH_CHECK();
}

template <int BM, bool G>
void launch_grouped(const GroupedArgs& a, int grid_x, int grid_y, cudaStream_t st) {
  constexpr int smem = grouped_smem<BM>();
  static bool configured = false;
  if (!configured) {
    BELUGA_CUDA_CHECK(
        cudaFuncSetAttribute(grouped_gemm_kernel<BM, G>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  launch(grouped_gemm_kernel<BM, G>, dim3(grid_x, grid_y), kThreads, smem, st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace

namespace {

RouteArgs route_args(Tensor ids, Tensor weights, int T, int E, const Tensor& bias, const RouterParams& p) {
  BELUGA_CHECK(
      E % p.n_group == 0 && p.topk_group <= p.n_group && p.top_k <= E && p.n_group <= 32 && E <= 1024,
      "moe_route: unsupported router parameters");
  BELUGA_CHECK(ids.dtype == DType::kI32 && weights.dtype == DType::kF32 && ids.is_contiguous() &&
                   weights.is_contiguous() && ids.numel() == int64_t(T) * p.top_k &&
                   weights.numel() == int64_t(T) * p.top_k,
               "moe_route: outputs must be contiguous [T, k] (I32 ids, F32 weights)");
  RouteArgs a{};
  a.bias = bias.empty() ? nullptr : bias.data;
  a.bias_f32 = bias.dtype == DType::kF32;
  a.ids = ids.ptr<int32_t>();
  a.weights = weights.ptr<float>();
  a.T = T;
  a.E = E;
  a.K = p.top_k;
  a.G = p.n_group;
  a.topk_group = p.topk_group;
  a.softmax = p.scoring == RouterScoring::kSoftmax;
  a.top2_sum = p.group_by_top2_sum;
  a.norm = p.norm_topk_prob;
  a.scaling = p.routed_scaling_factor;
  return a;
}

}  // namespace

void CudaOps::moe_route(Tensor ids, Tensor weights, const Tensor& logits, const Tensor& bias,
                        const RouterParams& p) {
  Prof prof_scope(this, "moe_route");
  gate_plan_ = {};
  BELUGA_CHECK(logits.dtype == DType::kF32 && logits.ndim == 2 && logits.stride[1] == 1,
               "moe_route: logits must be an F32 matrix, got ", logits.describe());
  const int T = int(logits.shape[0]), E = int(logits.shape[1]);
  RouteArgs a = route_args(ids, weights, T, E, bias, p);
  if (T == 0) return;
  a.logits = logits.ptr<const float>();
  a.ldl = logits.stride[0];
  const int warps = 4;
  launch(moe_route_kernel, int(ceil_div(T, warps)), warps * 32, size_t(warps) * 2 * E * sizeof(float),
         S(stream_), a);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::moe_gate(Tensor ids, Tensor weights, const Tensor& x, const Weight& router, const Tensor& bias,
                       const RouterParams& p) {
  const int T = int(x.shape[0]), D = int(x.shape[1]), E = int(router.out_features());
  // One kernel for a few tokens (see kGateMaxT) with GEMV-friendly operands; else router GEMM + route.
  bool fused = T >= 1 && T <= kGateMaxT && E <= kGateMaxE && x.dtype == DType::kBF16 && x.ndim == 2 &&
               x.stride[1] == 1 && router.bias.empty() && router.in_features() == D && D % 8 == 0 &&
               x.stride[0] % 8 == 0 && aligned16(x.data);
  Tensor wb;
  if (fused) {
    wb = bf16_weight(router.w, router.scale, router.block_n, router.block_k);
    fused = wb.ndim == 2 && wb.is_contiguous() && aligned16(wb.data);
  }
  if (!fused) {
    Ops::moe_gate(ids, weights, x, router, bias, p);  // its moe_route drops any earlier plan
    return;
  }
  Prof prof_scope(this, "moe_gate");
  GateArgs g{};
  g.r = route_args(ids, weights, T, E, bias, p);
  const ScratchMark mark = scratch_mark();
  Tensor logits = scratch(DType::kF32, {T, E});  // only this op's kernel reads it
  g.logits = logits.ptr<float>();
  g.r.logits = g.logits;
  g.r.ldl = E;
  g.x = x.ptr<const bf16>();
  g.ldx = x.stride[0];
  g.w = wb.ptr<const bf16>();
  g.K8 = D / 8;
  g.counters = arrival_counters(kGateCounters + 1);
  const GatePlanLayout L(T, p.top_k, E);
  if (L.total > gate_plan_capacity_) {
    BELUGA_CHECK(!capturing(S(stream_)), "moe_gate: the plan buffer must grow before graph capture");
    gate_plan_buf_ = alloc_persistent(DType::kI32, {L.total}).ptr<int>();
    gate_plan_capacity_ = L.total;
  }
  g.plan = gate_plan_buf_;
  const dim3 grid(unsigned(E), unsigned(ceil_div(T, kGateTok)));
  launch(moe_gate_kernel, grid, kGateThreads, size_t(kGateWarps) * 2 * E * sizeof(float), S(stream_), g);
  BELUGA_LAUNCH_CHECK();
  scratch_release(mark);
  gate_plan_ = {ids.data, T, p.top_k, E};
}

const CudaOps::ExpertTable& CudaOps::expert_table(std::span<const ExpertWeights> experts,
                                                  const ExpertWeights* shared) {
  const auto key = std::make_pair(static_cast<const void*>(experts.data()), static_cast<const void*>(shared));
  auto it = expert_tables_.find(key);
  if (it != expert_tables_.end()) return *it->second;
  auto t = std::make_unique<ExpertTable>();
  const int E = int(experts.size()), ne = E + (shared ? 1 : 0);
  std::vector<const void*> ptrs(size_t(3) * ne);
  std::vector<int> inter(ne);
  const int64_t D = experts[0].gate.in_features();
  for (int e = 0; e < ne; ++e) {
    const ExpertWeights& x = e < E ? experts[e] : *shared;
    const Weight* ws[3] = {&x.gate, &x.up, &x.down};
    for (int k = 0; k < 3; ++k) {
      const Tensor& b = bf16_weight(ws[k]->w, ws[k]->scale, ws[k]->block_n, ws[k]->block_k);
      BELUGA_CHECK(b.ndim == 2 && b.is_contiguous(), "expert weights must be contiguous matrices");
      ptrs[size_t(k) * ne + e] = b.data;
    }
    inter[e] = int(x.gate.out_features());
    BELUGA_CHECK(x.gate.in_features() == D && x.up.out_features() == inter[e] && x.down.out_features() == D &&
                     x.down.in_features() == inter[e],
                 "moe_experts: inconsistent expert shapes");
    BELUGA_CHECK(inter[e] % 8 == 0 && D % 8 == 0, "moe_experts: widths must be multiples of 8");
    BELUGA_CHECK(x.gate.bias.empty() && x.up.bias.empty() && x.down.bias.empty(),
                 "moe_experts: biases unsupported");
    t->i_max = std::max(t->i_max, inter[e]);
  }
  const size_t pbytes = ptrs.size() * sizeof(void*);
  BELUGA_CUDA_CHECK(cudaMalloc(&t->dev, pbytes + inter.size() * sizeof(int)));
  BELUGA_CUDA_CHECK(cudaMemcpy(t->dev, ptrs.data(), pbytes, cudaMemcpyHostToDevice));
  BELUGA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(t->dev) + pbytes, inter.data(), inter.size() * sizeof(int),
                               cudaMemcpyHostToDevice));
  t->ptrs = static_cast<const void* const*>(t->dev);
  t->inter = reinterpret_cast<const int*>(static_cast<char*>(t->dev) + pbytes);
  t->ne = ne;
  t->d = int(D);
  return *expert_tables_.emplace(key, std::move(t)).first->second;
}

void CudaOps::moe_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                          std::span<const ExpertWeights> experts, const ExpertWeights* shared) {
  Prof prof_scope(this, "moe_experts");
  BELUGA_CHECK(x.dtype == DType::kBF16 && x.ndim == 2 && x.stride[1] == 1 && out.dtype == DType::kBF16 &&
                   out.stride[1] == 1 && ids.dtype == DType::kI32 && ids.is_contiguous() &&
                   weights.dtype == DType::kF32 && weights.is_contiguous(),
               "moe_experts: operand types");
  const int T = int(x.shape[0]), D = int(x.shape[1]), K = int(ids.shape[1]);
  if (T == 0) return;
  const ExpertTable& tab = expert_table(experts, shared);
  BELUGA_CHECK(tab.d == D, "moe_experts: hidden size mismatch");
  const int E = int(experts.size()), ne = tab.ne;
  const int R = T * K + (shared ? T : 0);
  const ScratchMark mark = scratch_mark();  // plan, H, Y and the per-expert buffers: this op's own
  // Rows per expert pick the path: GEMV (decode, below), grouped tensor-core tiles (32 rows; 128 from
  // 64 rows when cuBLAS is not used), and from 64 rows per expert cuBLAS: grouped GEMM calls below 512
  // rows (2K prefill on V2-Lite: 55.9 -> 49.9 ms against the tile kernel) and one GEMM per expert and
  // projection above, on side streams (8K: 173 -> 163 ms; the grouped call took 188). Both need the
  // row counts on the host (a sync).
  const int64_t rows_per_expert = int64_t(T) * K / std::max(E, 1);
  const bool big = rows_per_expert >= 64;
  // The sync costs tens of microseconds, so small models stay on the kernel: cuBLAS only from ~50
  // GFLOP of expert work (V2-Lite from ~600 tokens; the demo model's 2K chunks are 2.4 GFLOP, and
  // syncing there cut `bench serve` output from ~25 K to 17.5 K tok/s). BELUGA_MOE_PREFILL
  // (benchmarking) forces one path from 64 rows: "kernel", "per-expert" or "cublas-grouped".
  const double expert_flops = 6.0 * double(R) * D * double(experts[0].gate.out_features());
  const bool per_expert_gemms = moe_prefill_ != MoePrefill::kKernel && rows_per_expert >= 64 &&
                                (expert_flops >= 5e10 || moe_prefill_ == MoePrefill::kPerExpert ||
                                 moe_prefill_ == MoePrefill::kCublasGrouped);
  const int bm = big ? 128 : 32;
  cudaStream_t st = S(stream_);
  int *start, *tile_start, *row_token, *entry_row;
  // The fused gate that routed these ids planned them already (for the small tiles the grouped kernel
  // uses at so few rows per expert).
  const GatePlan gp = std::exchange(gate_plan_, GatePlan{});
  if (gp.ids == ids.data && gp.T == T && gp.K == K && gp.E == E && bm == kGatePlanBm) {
    const GatePlanLayout L(T, K, E);
    start = gate_plan_buf_ + L.start;
    tile_start = gate_plan_buf_ + L.tile_start;
    row_token = gate_plan_buf_ + L.row_token;
    entry_row = gate_plan_buf_ + L.entry_row;
  } else {
    Tensor plan = scratch(DType::kI32, {2 * (ne + 1) + R + int64_t(T) * K});
    start = plan.ptr<int>();
    tile_start = start + ne + 1;
    row_token = tile_start + ne + 1;
    entry_row = row_token + R;
    launch(moe_plan_kernel, 1, 1024, size_t(2) * ne * sizeof(int), st, ids.ptr<const int32_t>(), T, K, E, ne,
           bm, start, tile_start, row_token, entry_row);
    BELUGA_LAUNCH_CHECK();
  }
  Tensor H = scratch(DType::kBF16, {R, tab.i_max});
  Tensor Y = scratch(DType::kF32, {R, D});
  // Decode: about one row per expert or fewer (and aligned rows) -> the GEMV path.
  const bool gemv = int64_t(T) * K <= 2 * int64_t(E) && x.stride[0] % 8 == 0 && aligned16(x.data);
  if (gemv) {
    GemvArgs g{};
    g.ptrs = tab.ptrs;
    g.inter = tab.inter;
    g.start = start;
    g.ne = ne;
    g.D = D;
    g.x = x.ptr<const bf16>();
    g.ldx = x.stride[0];
    g.row_token = row_token;
    g.out = H.data;
    g.ldo = tab.i_max;
    const int gy = std::min(R, ne);
    launch_gemv<true>(g, D, int(ceil_div(tab.i_max, kGvUnits<true>)), gy, st);
    g.x = H.ptr<const bf16>();
    g.ldx = tab.i_max;
    g.row_token = nullptr;
    g.out = Y.data;
    g.ldo = D;
    launch_gemv<false>(g, tab.i_max, int(ceil_div(D, kGvUnits<false>)), gy, st);
  } else if (per_expert_gemms && !capturing(st)) {
    // Measured (V2-Lite, H200): the grouped cuBLAS call beats the tensor-core kernel at 192 rows per
    // expert (2K prefill 55.9 -> 49.9 ms) but loses to one call per expert at 768 (8K: 188 vs 173 ms).
    const bool grouped = moe_prefill_ == MoePrefill::kCublasGrouped ||
                         (moe_prefill_ == MoePrefill::kAuto && rows_per_expert < 512);
    if (!grouped || !run_expert_gemms_grouped(x, H, Y, experts, shared, start, row_token, R))
      run_expert_gemms(x, H, Y, experts, shared, start, row_token, R);
  } else {
    run_grouped(x, H, Y, tab, start, tile_start, row_token, R, big, st);
  }
  launch(moe_combine_kernel, int(std::min<int64_t>(ceil_div(int64_t(T) * D, 256), 65536)), 256, 0, st,
         out.ptr<bf16>(), out.stride[0], Y.ptr<const float>(), D, entry_row, weights.ptr<const float>(), T, K,
         shared ? T * K : -1);
  BELUGA_LAUNCH_CHECK();
  scratch_release(mark);
}

void CudaOps::run_grouped(const Tensor& x, Tensor H, Tensor Y, const ExpertTable& tab, const int* start,
                          const int* tile_start, const int* row_token, int R, bool big, void* stream) {
  cudaStream_t st = S(stream);
  const int ne = tab.ne, D = tab.d, bm = big ? 128 : 32;
  const int grid_y = int(ceil_div(R, bm)) + ne;
  GroupedArgs a{};
  a.ptrs = tab.ptrs;
  a.inter = tab.inter;
  a.start = start;
  a.tile_start = tile_start;
  a.ne = ne;
  a.D = D;
  // gate + up (+ SiLU-and-mul): A = token rows of x.
  a.a = x.ptr<const bf16>();
  a.lda = x.stride[0];
  a.row_token = row_token;
  a.out = H.data;
  a.ldo = tab.i_max;
  const int gx1 = int(ceil_div(tab.i_max, kBN / 2));
  if (big)
    launch_grouped<128, true>(a, gx1, grid_y, st);
  else
    launch_grouped<32, true>(a, gx1, grid_y, st);
  // down: A = rows of H.
  a.a = H.ptr<const bf16>();
  a.lda = tab.i_max;
  a.row_token = nullptr;
  a.out = Y.data;
  a.ldo = D;
  const int gx2 = int(ceil_div(D, kBN));
  if (big)
    launch_grouped<128, false>(a, gx2, grid_y, st);
  else
    launch_grouped<32, false>(a, gx2, grid_y, st);
}

}  // namespace beluga
