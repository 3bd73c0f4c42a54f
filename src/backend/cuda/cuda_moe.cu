// Mixture-of-experts products on the GPU: a device-side plan that groups token rows by expert (or the
// one the fused gate left), then GEMV kernels (decode), one grouped GEMM launch for gate+up (with
// SiLU-and-mul in its epilogue) and one for down over all experts at once (wgmma tiles of 128 token rows
// in cuda_moe_wgmma.cu, or of 128 weight rows for decode batches in cuda_moe_swap.cu; mma.sync tiles of
// 32 or 128 rows here without them), or cuBLAS when forced or for a prefill's shared expert
// (cuda_moe_cublas.cu), and a combine step. Routing is in cuda_moe_route.cu.
#include <algorithm>
#include <climits>
#include <cmath>
#include <utility>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernel_config.h"
#include "backend/cuda/cuda_mma_stage.cuh"
#include "backend/cuda/cuda_moe_grouped.cuh"
#include "backend/cuda/cuda_moe_plan.cuh"
#include "backend/cuda/cuda_moe_token.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

__global__ void moe_plan_kernel(const int32_t* ids, int T, int K, int E, int ne, int bm, int* start,
                                int* tile_start, int* row_token, int* entry_row) {
  pdl_entry();
  extern __shared__ int cnt[];  // [ne] counts, then [ne] fill cursors
  build_plan(ids, T, K, E, ne, bm, start, tile_start, row_token, entry_row, cnt);
}

// ---- grouped GEMM over experts (mma.sync m16n8k16, BF16 in, F32 accumulate) ----
// kBK = 64: each stage reads 128 contiguous bytes of every weight row (32 gave 64-byte pieces of rows
// 4 KB apart and 1.3 TB/s; 128 with 3 stages was slower again); 3 stages keep 32-row tiles at 3 blocks
// per SM (bench/NOTES.md runs 43-45).
constexpr int kBN = 128, kBK = 64, kLdS = kBK + 8, kStages = 3, kThreads = 256, kParts = kBK / 8;

template <int BM>
constexpr int grouped_smem() {
  return kStages * (BM + kBN) * kLdS * 2;
}

// kGateUp: the 128-row weight tile holds 64 hidden units as [gate 16 | up 16] x 4 (one group per warp
// column), so each thread has gate and up of the same unit and writes silu(g) * u (BF16 [R, I]).
// Otherwise: down projection into Y [R, D] (F32 or BF16: store_y).
template <int BM, bool kGateUp>
__global__ void __launch_bounds__(kThreads) grouped_gemm_kernel(GroupedArgs p) {
  pdl_entry();
  constexpr int WM = BM / 2, MT = WM / 16;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* As = reinterpret_cast<bf16*>(smem_raw);
  bf16* Bs = As + kStages * BM * kLdS;
  ExpertTile t;
  if (!expert_tile<kGateUp>(p, BM, kGateUp ? kBN / 2 : kBN, t)) return;
  const int m0 = t.m0, m_end = t.m_end, K = t.K, Nout = t.Nout, n0 = t.n0;
  const bf16 *w0 = t.w0, *w1 = t.w1;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  const int KT = (K + kBK - 1) / kBK;

  // A thread's 16-byte pieces of the A and B tiles are the same rows and column offset at every K
  // step (kThreads is a multiple of kParts): their row pointers (token rows gathered through
  // row_token, gate/up/down weight rows) once here, not per stage (ncu, prefill 512: the per-stage
  // index math and row_token loads made the kernel issue-bound at 1.7 TB/s).
  constexpr int kAChunks = BM * kParts / kThreads, kBChunks = kBN * kParts / kThreads;
  static_assert(kThreads % kParts == 0 && kAChunks >= 1 && kBChunks >= 1);
  const int part8 = (tid % kParts) * 8;
  const bf16* a_src[kAChunks];
  const bf16* b_src[kBChunks];
  bool a_ok[kAChunks], b_ok[kBChunks];
#pragma unroll
  for (int i = 0; i < kAChunks; ++i) {
    const int r = m0 + (tid + i * kThreads) / kParts;
    a_ok[i] = r < m_end;
    a_src[i] = a_ok[i] ? p.a + (kGateUp ? int64_t(p.row_token[r]) : int64_t(r)) * p.lda + part8 : p.a;
  }
#pragma unroll
  for (int i = 0; i < kBChunks; ++i) {
    const int rr = (tid + i * kThreads) / kParts;
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
    b_ok[i] = idx < Nout;
    b_src[i] = b_ok[i] ? base + int64_t(idx) * K + part8 : w0;
  }
  auto load = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    const bool k_ok = k0 + part8 < K;
    bf16* as = As + stage * BM * kLdS + part8;
    bf16* bs = Bs + stage * kBN * kLdS + part8;
#pragma unroll
    for (int i = 0; i < kAChunks; ++i) {
      const bool ok = a_ok[i] && k_ok;
      cp_async16(as + ((tid + i * kThreads) / kParts) * kLdS, ok ? a_src[i] + k0 : p.a, ok);
    }
#pragma unroll
    for (int i = 0; i < kBChunks; ++i) {
      const bool ok = b_ok[i] && k_ok;
      cp_async16(bs + ((tid + i * kThreads) / kParts) * kLdS, ok ? b_src[i] + k0 : w0, ok);
    }
  };

  float acc[MT][4][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;

  cp_async_pipeline<kStages>(KT, load, [&](int buf) {
    mma_stage<MT, 4, kBK, kLdS>(acc, As + buf * BM * kLdS, wm * WM, Bs + buf * kBN * kLdS, wn * 32, lane);
  });

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
            if (col < Nout) o[col] = __float2bfloat16(swiglu(gv, uv, p.swiglu_limit));
          }
      } else {
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int col = n0 + wn * 32 + nt * 8 + 2 * t4 + q;
            if (col < Nout) store_y(p, int64_t(r) * p.ldo + col, acc[mt][nt][half * 2 + q]);
          }
      }
    }
}

// Tokens from which a prefill's shared expert runs as cuBLAS GEMMs instead of in the routed tiles.
constexpr int kSharedCublasMinT = 256;

// out[t] = sum_k w[t, k] Y[entry_row[t, k]] (+ Ys[t], the shared expert's row), 8 columns per thread
// (D % 8 == 0). Y and Ys: F32 or BF16 (moe_experts says when).
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x, v[2 * i + 1] = f.y;
  }
}
template <class TY>
__global__ void moe_combine_kernel(bf16* out, int64_t ldo, const TY* Y, int D, const int* entry_row,
                                   const float* w, int T, int K, const TY* Ys) {
  pdl_entry();
  const int D8 = D / 8;
  const int64_t n = int64_t(T) * D8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(i / D8), d = int(i % D8) * 8;
    float acc[8] = {}, y[8];
    for (int k = 0; k < K; ++k) {
      const float wk = w[int64_t(t) * K + k];
      load8(Y + int64_t(entry_row[int64_t(t) * K + k]) * D + d, y);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += wk * y[j];
    }
    if (Ys) {
      load8(Ys + int64_t(t) * D + d, y);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[j] += y[j];
    }
    uint4 o;
    uint32_t* op = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) op[j] = pack_bf16(acc[2 * j], acc[2 * j + 1]);
    *reinterpret_cast<uint4*>(out + int64_t(t) * ldo + d) = o;
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
  float swiglu_limit;  // > 0: the gate-up epilogue clamps (swiglu())
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
                __float2bfloat16(swiglu(gv, uv, p.swiglu_limit));
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
  launch(moe_gemv_kernel<G>, dim3(grid_x, grid_y), kGvThreads, smem, st, a);
  BELUGA_LAUNCH_CHECK();
}

template <int BM, bool G>
void launch_grouped(const GroupedArgs& a, int grid_x, int grid_y, cudaStream_t st) {
  constexpr int smem = grouped_smem<BM>();
  launch(grouped_gemm_kernel<BM, G>, dim3(grid_x, grid_y), kThreads, smem, st, a);
  BELUGA_LAUNCH_CHECK();
}

// The mma.sync tile kernel for bm rows per tile (32, or 128 when the wgmma one is switched off).
template <bool G>
void launch_grouped(int bm, const GroupedArgs& a, int grid_x, int grid_y, cudaStream_t st) {
  if (bm == 128)
    launch_grouped<128, G>(a, grid_x, grid_y, st);
  else
    launch_grouped<32, G>(a, grid_x, grid_y, st);
}

}  // namespace

void cuda::configure_moe_kernels(int smem_optin) {
  for (auto k : {moe_gemv_kernel<true>, moe_gemv_kernel<false>}) {
    cudaFuncAttributes fa{};  // the limit covers static and dynamic shared memory together
    BELUGA_CUDA_CHECK(cudaFuncGetAttributes(&fa, k));
    allow_dynamic_smem(k, smem_optin - int(fa.sharedSizeBytes));
  }
  for (auto k : {grouped_gemm_kernel<128, true>, grouped_gemm_kernel<128, false>})
    allow_dynamic_smem(k, grouped_smem<128>());
  for (auto k : {grouped_gemm_kernel<32, true>, grouped_gemm_kernel<32, false>})
    allow_dynamic_smem(k, grouped_smem<32>());
}

const CudaOps::ExpertTable& CudaOps::expert_table(std::span<const ExpertWeights> experts,
                                                  const ExpertWeights* shared) {
  const auto key = std::make_pair(static_cast<const void*>(experts.data()), static_cast<const void*>(shared));
  const int E = int(experts.size()), ne = E + (shared ? 1 : 0);
  auto source = [&](size_t i) {  // gate, up, down of expert i / 3
    const ExpertWeights& x = int(i / 3) < E ? experts[i / 3] : *shared;
    return (i % 3 == 0 ? x.gate : i % 3 == 1 ? x.up : x.down).w.data;
  };
  const bool capture = capturing(S(stream_));
  auto it = expert_tables_.find(key);
  if (it != expert_tables_.end()) {
    const std::vector<const void*>& had = it->second->sources;
    bool same = had.size() == size_t(3) * ne;
    for (size_t i = 0; same && i < had.size(); ++i) same = had[i] == source(i);
    if (same) {
      it->second->captured = it->second->captured || capture;
      return *it->second;
    }
    // A graph captured earlier holds this table's device pointers, so it is not rebuilt under it.
    BELUGA_CHECK(!it->second->captured && !capture,
                 "moe_experts: another weight set now lives at the address of one whose expert table a "
                 "recorded graph holds; expert weights must outlive the backend");
    // Eager steps only (a live EPLB placement's new expert list at a freed list's address): rebuilt.
    // Its device pointers may still be read by work queued before: wait for it.
    BELUGA_CUDA_CHECK(cudaStreamSynchronize(S(stream_)));
    expert_tables_.erase(it);
  }
  auto t = std::make_unique<ExpertTable>();
  t->sources.resize(size_t(3) * ne);
  for (size_t i = 0; i < t->sources.size(); ++i) t->sources[i] = source(i);
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
  t->i_routed = inter[0];
  for (int e = 1; e < E; ++e)
    if (inter[e] != t->i_routed) t->i_routed = 0;
  t->i_shared = shared ? inter[E] : 0;
  const size_t pbytes = ptrs.size() * sizeof(void*);
  BELUGA_CUDA_CHECK(cudaMalloc(&t->dev, pbytes + inter.size() * sizeof(int)));
  BELUGA_CUDA_CHECK(cudaMemcpy(t->dev, ptrs.data(), pbytes, cudaMemcpyHostToDevice));
  BELUGA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(t->dev) + pbytes, inter.data(), inter.size() * sizeof(int),
                               cudaMemcpyHostToDevice));
  t->ptrs = static_cast<const void* const*>(t->dev);
  t->inter = reinterpret_cast<const int*>(static_cast<char*>(t->dev) + pbytes);
  t->ne = ne;
  t->d = int(D);
  t->captured = capture;
  return *expert_tables_.emplace(key, std::move(t)).first->second;
}

void CudaOps::moe(Tensor out, const NormedInput& in, const MoeLayerRef& m) {
  // A few tokens with a shared expert: the fused gate's extra blocks run the shared expert's gate-up
  // while its router blocks route, then the routed units and the down projection.
  const int K = m.params.top_k;
  if (deterministic_) {  // the norm, router GEMM, routing and experts as separate batch-invariant ops
    Ops::moe(out, in, m);
    return;
  }
  const int64_t T0 = in.out.shape[0];
  if (T0 >= 1 && T0 <= kTokMaxTokens && m.shared && m.experts[0].swiglu_limit == 0) {
    const ExpertTable& tab = expert_table(m.experts, m.shared);
    if (few_token_path(in.out, K, tab)) {
      Prof prof_scope(this, "moe");
      const ScratchMark mark = scratch_mark();
      Tensor ids = scratch(DType::kI32, {T0, K}), weights = scratch(DType::kF32, {T0, K});
      Tensor H = scratch(DType::kBF16, {T0 * (K + 1), tab.i_max});
      const bool done = fused_gate(ids, weights, in.out, m.router, m.bias, m.params, &in, &tab, H) &&
                        token_experts(out, in.out, ids, weights, tab, true, H, /*shared_done=*/true);
      scratch_release(mark);
      if (done) return;
    }
  }
  // A prefill's shared expert does not depend on the routing: its GEMMs start on a side stream right
  // after the norm, beside the router, the routing, the plan and the routed tiles on the main stream.
  const int T = int(in.out.shape[0]), D = int(in.out.shape[1]), E = int(m.experts.size());
  if (m.shared && shared_on_side_ && T > 0) {
    const ExpertPath path = expert_path(T, K, E, D, m.experts[0].gate.out_features(), true);
    if (path.shared_apart) {
      Prof prof_scope(this, "moe");
      normalize(in);
      // FP8 and F32 weights are converted on the main stream at first use: before the fork, so the side
      // stream's GEMMs see them.
      expert_table(m.experts, m.shared);
      const ScratchMark mark = scratch_mark();
      Tensor ys = scratch(path.y_f32 ? DType::kF32 : DType::kBF16, {T, D});
      Tensor ids = scratch(DType::kI32, {T, K}), weights = scratch(DType::kF32, {T, K});
      fork_side_streams();
      shared_expert_gemms(in.out, ys, *m.shared, 0);
      moe_gate(ids, weights, in.out, m.router, m.bias, m.params);
      moe_experts_impl(out, in.out, ids, weights, m.experts, m.shared, &ys);  // joins before its sum
      scratch_release(mark);
      return;
    }
  }
  Ops::moe(out, in, m);
}

CudaOps::ExpertPath CudaOps::expert_path(int T, int K, int E, int D, int64_t inter, bool shared) const {
  ExpertPath p;
  // Rows per expert pick the path: GEMV (decode, below), grouped tensor-core tiles (32 rows on
  // mma.sync, 128 on wgmma), or one cuBLAS GEMM per expert and projection on side streams (needs the
  // row counts on the host: a sync). Measured on V2-Lite (H200, bench/NOTES.md run 55): the wgmma tiles
  // run the 8K prefill (768 rows per expert) in 135 ms against 147-154 ms with per-expert cuBLAS, so
  // cuBLAS is only taken when BELUGA_MOE_PREFILL asks for it, or without the wgmma tiles from 512 rows
  // per expert and ~50 GFLOP (the sync costs tens of microseconds: the demo model's 2K chunks are 2.4
  // GFLOP, and syncing there cut `bench serve` output from ~25 K to 17.5 K tok/s).
  const int64_t R = int64_t(T) * K + (shared ? T : 0);
  const int64_t rows_per_expert = int64_t(T) * K / std::max(E, 1);
  const double expert_flops = 6.0 * double(R) * D * double(inter);
  p.per_expert_gemms = moe_prefill_ != MoePrefill::kKernel && rows_per_expert >= 64 &&
                       ((!wgmma_experts_ && expert_flops >= 5e10 && rows_per_expert >= 512) ||
                        moe_prefill_ == MoePrefill::kPerExpert || moe_prefill_ == MoePrefill::kCublasGrouped);
  // Tiles: below 32 rows per expert the swapped ones (128 weight rows x up to 32 token rows, wgmma;
  // cuda_moe_swap.cu), from there 128 token rows x 256 weight rows (wgmma). Measured on V2-Lite (H200,
  // bench/NOTES.md runs 67-69, 1K context): swapped against token-row tiles b=4 5.78 -> 5.28 ms, b=8
  // 6.92 -> 6.34, b=16 8.80 -> 8.01, b=64 11.5 -> 10.4, b=256 (24 rows per expert) 15.5 -> 14.8; at 48
  // rows and more (prefill 512) the swapped layout lost even with tiles up to 256 tokens wide (13.5 ->
  // 16.3 ms). Without the swapped tiles: 128 rows (wgmma) from 16 rows per expert, else 32 (mma.sync).
  p.swap = swap_experts_ && rows_per_expert < 32;
  p.bm = p.swap ? kSwapTileRows : rows_per_expert >= 16 ? 128 : 32;
  // Up to E / 4 rows (V2-Lite: 2 tokens) the GEMV path; from there the swapped tiles stream the weights
  // faster (bench/NOTES.md run 69, V2-Lite 1K context: b=4 5.78 -> 5.28 ms; b=2 3.69 on the GEMV
  // against 3.75 on the tiles).
  p.gemv = 4 * int64_t(T) * K <= int64_t(E);
  // Y (the experts' down rows) in BF16 from 1024 tokens on, else F32. At a 2K prefill on V2-Lite the F32 Y
  // was ~134 MB per layer written and read again; BF16 halves it (2K 28.0 -> 27.0 ms, 8K 115 -> 112;
  // bench/NOTES.md run 73), as HF's and vLLM's MoE round each expert's output to the activation type. Below
  // that Y's bytes are a few percent of the weights', and the F32 sum keeps short prompts and decode steps
  // as before: with BF16 Y everywhere the demo model's greedy tokens left the CPU path's at the 10th
  // (run 77), and the GEMV path's one-token twin (F32) is tested bit-equal to it.
  p.y_f32 = p.gemv || T < 1024;  // the GEMV kernels write F32
  // A prefill's shared expert takes every token: a dense product that cuBLAS runs at ~750 TFLOP/s
  // (V2-Lite, 2K rows: 62 + 32 us for one GEMM each) against the tiles' ~420 (~120 us of the 2K layer's
  // 676). Same binary, tiles against cuBLAS (bench/NOTES.md runs 91-92): 512 12.53 -> 12.27 ms, 2K 26.44
  // -> 26.19 (medians of 3), 8K 111.6 -> 108.7.
  p.shared_apart = shared && shared_experts_cublas_ && !p.per_expert_gemms && !p.gemv && !p.swap &&
                   p.bm == kWgTileRows && wgmma_experts_ && T >= kSharedCublasMinT;
  if (deterministic_) {
    // The mma.sync tiles for every row count: an element's sum over K is one warp's chain of k16 steps
    // whatever the tile's rows (32 or 128), and Y stays F32, so a token's expert rows do not depend on
    // how many other tokens an expert has. (The GEMV and wgmma paths sum in other orders.)
    p = ExpertPath{};
    p.bm = rows_per_expert >= 16 ? 128 : 32;
    p.y_f32 = true;
  }
  return p;
}

void CudaOps::moe_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                          std::span<const ExpertWeights> experts, const ExpertWeights* shared) {
  moe_experts_impl(out, x, ids, weights, experts, shared, nullptr);
}

void CudaOps::moe_experts_impl(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                               std::span<const ExpertWeights> experts, const ExpertWeights* shared,
                               const Tensor* shared_y) {
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
  ExpertPath path = expert_path(T, K, E, D, experts[0].gate.out_features(), shared != nullptr);
  // DeepSeek-V4 clamps gate and up before the SiLU (swiglu()): every path's gate-up epilogue does,
  // but for the shared expert's cuBLAS GEMMs and the one-token kernels, which such experts skip.
  const float limit = experts[0].swiglu_limit;
  if (limit > 0) {
    BELUGA_CHECK(!shared_y, "moe_experts: clamped SwiGLU experts (swiglu_limit) take no shared expert apart");
    path.shared_apart = false;
  }
  BELUGA_CHECK(!shared_y || path.shared_apart, "moe_experts: a shared expert computed apart needs that path");
  // With the shared expert's rows elsewhere (shared_y), Y holds the routed rows only.
  const int R = T * K + (shared && !shared_y ? T : 0);
  const ScratchMark mark = scratch_mark();  // plan, H, Y and the per-expert buffers: this op's own
  // The kernels read x's rows in 16-byte pieces: a view whose rows start elsewhere (a row stride that is
  // not a multiple of 8, an odd column offset) is copied into aligned scratch first.
  Tensor x16 = x;
  if (!rows16(D, {x.stride[0]}, {x.data})) {
    x16 = scratch(DType::kBF16, {T, D});
    copy(x16, x);
  }
  if (!shared_y && limit == 0 && token_experts(out, x16, ids, weights, tab, shared != nullptr)) {
    scratch_release(mark);  // drops any plan the gate left
    return;
  }
  const bool swap = path.swap, gemv = path.gemv;
  const int bm = path.bm;
  static_assert(kGatePlanBm == kSwapTileRows, "the fused gate plans the decode batches' tiles");
  cudaStream_t st = S(stream_);
  int *start, *tile_start, *row_token, *entry_row;
  // The fused gate that routed these ids planned them already (for the small tiles the grouped kernel
  // uses at so few rows per expert).
  const GatePlan gp = std::exchange(gate_plan_, GatePlan{});
  if (!shared_y && gp.ids == ids.data && gp.T == T && gp.K == K && gp.E == E && bm == kGatePlanBm) {
    const GatePlanLayout L(T, K, E);
    start = gate_plan_buf_ + L.start;
    tile_start = gate_plan_buf_ + L.tile_start;
    row_token = gate_plan_buf_ + L.row_token;
    entry_row = gate_plan_buf_ + L.entry_row;
  } else {
    // Planned over ne experts either way; with shared_y no shared rows are counted (R has none).
    Tensor plan = scratch(DType::kI32, {2 * (ne + 1) + R + int64_t(T) * K});
    start = plan.ptr<int>();
    tile_start = start + ne + 1;
    row_token = tile_start + ne + 1;
    entry_row = row_token + R;
    launch(moe_plan_kernel, 1, 1024, size_t(2) * ne * sizeof(int), st, ids.ptr<const int32_t>(), T, K, E,
           shared_y ? E : ne, bm, start, tile_start, row_token, entry_row);
    BELUGA_LAUNCH_CHECK();
  }
  Tensor H = scratch(DType::kBF16, {R, tab.i_max});
  Tensor Y = scratch(path.y_f32 ? DType::kF32 : DType::kBF16, {R, D});
  if (gemv) {
    GemvArgs g{};
    g.ptrs = tab.ptrs;
    g.inter = tab.inter;
    g.start = start;
    g.ne = ne;
    g.D = D;
    g.x = x16.ptr<const bf16>();
    g.ldx = x16.stride[0];
    g.row_token = row_token;
    g.out = H.data;
    g.ldo = tab.i_max;
    g.swiglu_limit = limit;
    const int gy = std::min(R, ne);
    launch_gemv<true>(g, D, int(ceil_div(tab.i_max, kGvUnits<true>)), gy, st);
    g.x = H.ptr<const bf16>();
    g.ldx = tab.i_max;
    g.row_token = nullptr;
    g.out = Y.data;
    g.ldo = D;
    launch_gemv<false>(g, tab.i_max, int(ceil_div(D, kGvUnits<false>)), gy, st);
  } else if (path.per_expert_gemms && !capturing(st)) {
    // The grouped cuBLAS call lost to one call per expert at 768 rows (8K: 188 vs 173 ms).
    const bool grouped = moe_prefill_ == MoePrefill::kCublasGrouped && limit == 0;
    if (!grouped || !run_expert_gemms_grouped(x16, H, Y, experts, shared, start, row_token, R))
      run_expert_gemms(x16, H, Y, experts, shared, start, row_token, R, limit);
  } else {
    run_grouped(x16, H, Y, tab, start, tile_start, row_token, R, bm, swap, path.shared_apart ? E : ne, limit,
                stream_);
    if (path.shared_apart && !shared_y) shared_expert_gemms(x16, Y.rows(int64_t(T) * K, R), *shared);
  }
  if (shared_y) join_side_streams();
  // The shared expert's rows: after the routed ones in Y, or in shared_y.
  const void* ys = !shared    ? nullptr
                   : shared_y ? shared_y->data
                              : static_cast<const char*>(Y.data) + int64_t(T) * K * D * dtype_size(Y.dtype);
  // The output's rows take 16-byte stores (bf16 x 8) when aligned; else a copy from aligned scratch.
  Tensor o16 = rows16(D, {out.stride[0]}, {out.data}) ? out : scratch(DType::kBF16, {T, D});
  const int grid = int(std::min<int64_t>(ceil_div(int64_t(T) * D / 8, 256), 65536));
  if (path.y_f32)
    launch(moe_combine_kernel<float>, grid, 256, 0, st, o16.ptr<bf16>(), o16.stride[0], Y.ptr<const float>(),
           D, entry_row, weights.ptr<const float>(), T, K, static_cast<const float*>(ys));
  else
    launch(moe_combine_kernel<bf16>, grid, 256, 0, st, o16.ptr<bf16>(), o16.stride[0], Y.ptr<const bf16>(), D,
           entry_row, weights.ptr<const float>(), T, K, static_cast<const bf16*>(ys));
  BELUGA_LAUNCH_CHECK();
  if (o16.data != out.data) copy(out, o16);
  scratch_release(mark);
}

void CudaOps::run_grouped(const Tensor& x, Tensor H, Tensor Y, const ExpertTable& tab, const int* start,
                          const int* tile_start, const int* row_token, int R, int bm, bool swap, int ne_tiles,
                          float swiglu_limit, void* stream) {
  cudaStream_t st = S(stream);
  const int ne = tab.ne, D = tab.d;
  const int grid_y = int(ceil_div(R, bm)) + ne_tiles;
  GroupedArgs a{};
  a.ptrs = tab.ptrs;
  a.inter = tab.inter;
  a.start = start;
  a.tile_start = tile_start;
  a.ne = ne;
  a.ne_tiles = ne_tiles;
  a.D = D;
  // gate + up (+ SiLU-and-mul): A = token rows of x.
  a.a = x.ptr<const bf16>();
  a.lda = x.stride[0];
  a.row_token = row_token;
  a.out = H.data;
  a.ldo = tab.i_max;
  a.swiglu_limit = swiglu_limit;
  // Routed experts alone: the grid spans their width, not the shared expert's.
  const int gate_cols = ne_tiles < ne && tab.i_routed > 0 ? tab.i_routed : tab.i_max;
  const bool wgmma = bm == kWgTileRows && wgmma_experts_;
  if (swap)
    launch_swap_tiles(true, a, grid_y, st);
  else if (wgmma)
    launch_wgmma_tiles(true, a, gate_cols, grid_y, st);
  else
    launch_grouped<true>(bm, a, int(ceil_div(gate_cols, kBN / 2)), grid_y, st);
  // down: A = rows of H.
  a.a = H.ptr<const bf16>();
  a.lda = tab.i_max;
  a.row_token = nullptr;
  a.out = Y.data;
  a.y_f32 = Y.dtype == DType::kF32;
  a.ldo = D;
  if (swap)
    launch_swap_tiles(false, a, grid_y, st);
  else if (wgmma)
    launch_wgmma_tiles(false, a, D, grid_y, st);
  else
    launch_grouped<false>(bm, a, int(ceil_div(D, kBN)), grid_y, st);
}

}  // namespace beluga
