// MoE routing on the GPU: softmax/sigmoid scores, bias for selection, group-limited top-k, one warp
// per token; for a few tokens fused with the router GEMV into one kernel whose last block also plans
// the experts' rows for the moe_experts that follows.
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe_plan.cuh"
#include "backend/cuda/cuda_moe_token.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

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
// from L2 (__ldcg): the fused gate kernel reads logits that other blocks of its grid wrote. Logits and
// bias load in one round, and each chosen expert's id and weight stay in lane k's registers until one
// store each: at batch 1 this runs alone at the end of the fused gate kernel, so every dependent
// round trip to memory is on the step's critical path.
__device__ void route_token(const RouteArgs& a, int t, float* s) {
  const int lane = threadIdx.x & 31;
  float* sel = s + a.E;
  const float* z = a.logits + int64_t(t) * a.ldl;
  for (int e = lane; e < a.E; e += 32) {  // each lane reads back only its own elements below
    s[e] = __ldcg(z + e);
    sel[e] = !a.bias      ? 0.0f
             : a.bias_f32 ? static_cast<const float*>(a.bias)[e]
                          : to_f(static_cast<const bf16*>(a.bias)[e]);
  }
  if (a.softmax) {
    float mx = -INFINITY;
    for (int e = lane; e < a.E; e += 32) mx = fmaxf(mx, s[e]);
    mx = warp_max(mx);
    float sum = 0;
    for (int e = lane; e < a.E; e += 32) sum += (s[e] = expf(s[e] - mx));
    sum = warp_sum(sum);
    for (int e = lane; e < a.E; e += 32) s[e] /= sum;
  } else {
    for (int e = lane; e < a.E; e += 32) s[e] = 1.0f / (1.0f + expf(-s[e]));
  }
  for (int e = lane; e < a.E; e += 32) sel[e] = s[e] + sel[e];
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
  float wsum = 0, my_w = 0;
  int my_id = 0;
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
    if (lane == k) {
      my_id = idx;
      my_w = w;
    }
  }
  if (lane < a.K) {
    if (a.norm) my_w /= (wsum + 1e-20f);
    a.ids[int64_t(t) * a.K + lane] = my_id;
    a.weights[int64_t(t) * a.K + lane] = my_w * a.scaling;
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

struct GateArgs {
  const bf16* x;
  int64_t ldx;
  const bf16* w;  // [E, D]
  int K8;         // D / 8
  float* logits;  // F32 [T, E] scratch; r.logits points to it
  int* counters;  // [kGateCounters + 1]: per token group, then the groups that have routed
  int* plan;      // GatePlanLayout(T, K, E); null: no plan (one token takes the unplanned path)
  RouteArgs r;
  NormArgs norm;  // kNorm: x is norm's input still to be normalized (norm_moe_gate)
  TokenArgs tok;  // tok.Is > 0 (one token, kNorm): blocks E.. compute the shared expert's gate-up
};

// kNorm: each block first normalizes its group's rows into shared memory after the routing scratch
// (block_rmsnorm_rows; block 0 also stores them and the new residual rows).
// kRows: the group's rows a block holds (kGateTok, or 1 or 4 for T <= kRows).
template <bool kNorm, int kRows>
__global__ void __launch_bounds__(kGateThreads) moe_gate_kernel(GateArgs g) {
  static_assert(kGateThreads == kNormThreads);
  extern __shared__ __align__(16) float gate_sm[];  // routing scratch: [kGateWarps][2 E]; rows [nt][D]
  __shared__ float red[kGateWarps][kRows];
  __shared__ bool s_last;
  const int e = blockIdx.x, E = g.r.E;
  const bf16* wr = g.w + int64_t(e) * g.K8 * 8;
  pdl_entry();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int t0 = blockIdx.y * kGateTok, nt = min(kRows, g.r.T - t0);
  bf16* xs = reinterpret_cast<bf16*>(gate_sm + kGateWarps * 2 * E);
  if (kNorm && e >= E) {  // the shared expert's units, on the tokens normalized here as well (one group)
    block_rmsnorm_rows<kRows>(g.norm, 0, nt, xs, g.norm.D, xs, g.norm.D, false);
    const int nb = int(gridDim.x) - E, Is = g.tok.Is;
    for (int v = (e - E) * kGateWarps + warp; v < nt * Is; v += nb * kGateWarps) {
      const int t = v / Is, u = v - t * Is;
      token_gate_up_unit(g.tok, reinterpret_cast<const uint4*>(xs + t * g.norm.D),
                         t * (g.tok.K + 1) + g.tok.K, u, g.tok.ne - 1);
    }
    return;
  }
  // With a norm: the first round of the router row into registers before it (volatile loads stay
  // ahead of its barriers), so the prologue runs under their latency.
  uint4 first[kGateLoads];
  if (kNorm) {
#pragma unroll
    for (int j = 0; j < kGateLoads; ++j) {
      const int c = int(threadIdx.x) + j * kGateThreads;
      first[j] = c < g.K8 ? ld_stream_early(wr + c * 8) : uint4{};
    }
    block_rmsnorm_rows<kRows>(g.norm, t0, nt, xs, g.norm.D, xs, g.norm.D, blockIdx.x == 0);
  }
  float acc[kRows] = {};
  for (int c0 = threadIdx.x; c0 < g.K8; c0 += kGateThreads * kGateLoads) {
    uint4 wv[kGateLoads];
#pragma unroll
    for (int j = 0; j < kGateLoads; ++j) {
      const int c = c0 + j * kGateThreads;
      wv[j] = kNorm && c0 == int(threadIdx.x) ? first[j] : c < g.K8 ? ld_stream(wr + c * 8) : uint4{};
    }
#pragma unroll
    for (int j = 0; j < kGateLoads; ++j) {
      const int c = c0 + j * kGateThreads;
      if (c >= g.K8) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (r < nt)
          acc[r] += dot8(wv[j], kNorm ? reinterpret_cast<const uint4*>(xs + r * g.norm.D)[c]
                                      : __ldg(reinterpret_cast<const uint4*>(g.x + (t0 + r) * g.ldx) + c));
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
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
  if (threadIdx.x == 0) s_last = arrive(&g.counters[blockIdx.y]) == E - 1;
  __syncthreads();
  if (!s_last) return;
  if (warp < nt) route_token(g.r, t0 + warp, gate_sm + size_t(warp) * 2 * E);
  // Every block of the group has arrived, and the next kernel reading this slot starts after this
  // grid completes: a plain store resets it.
  if (threadIdx.x == 0) g.counters[blockIdx.y] = 0;
  if (!g.plan) return;
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

RouteArgs route_args(Tensor ids, Tensor weights, int T, int E, const Tensor& bias, const RouterParams& p) {
  BELUGA_CHECK(E % p.n_group == 0 && p.topk_group <= p.n_group && p.top_k <= E && p.top_k <= 32 &&
                   p.n_group <= 32 && E <= 1024,
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
  if (!fused_gate(ids, weights, x, router, bias, p, nullptr))
    Ops::moe_gate(ids, weights, x, router, bias, p);  // its moe_route drops any earlier plan
}

void CudaOps::norm_moe_gate(Tensor ids, Tensor weights, const NormedInput& in, const Weight& router,
                            const Tensor& bias, const RouterParams& p) {
  if (!fused_gate(ids, weights, in.out, router, bias, p, &in))
    Ops::norm_moe_gate(ids, weights, in, router, bias, p);  // normalize, then (maybe fused) moe_gate
}

bool CudaOps::fused_gate(Tensor ids, Tensor weights, const Tensor& x, const Weight& router,
                         const Tensor& bias, const RouterParams& p, const NormedInput* norm,
                         const ExpertTable* tab, Tensor H) {
  const int T = int(x.shape[0]), D = int(x.shape[1]), E = int(router.out_features());
  // One kernel for a few tokens (see kGateMaxT) with GEMV-friendly operands; else router GEMM + route.
  // With a norm, the group's rows must also fit in shared memory (48 KB in all).
  const size_t route_smem = size_t(kGateWarps) * 2 * E * sizeof(float);
  const size_t smem = route_smem + (norm ? size_t(std::min(T, kGateTok)) * D * 2 : 0);
  NormArgs na{};
  bool fused = !deterministic_ && T >= 1 && T <= kGateMaxT && E <= kGateMaxE && x.dtype == DType::kBF16 &&
               x.ndim == 2 && x.stride[1] == 1 && router.bias.empty() && router.in_features() == D &&
               D % 8 == 0 && x.stride[0] % 8 == 0 && aligned16(x.data) && smem <= (48 << 10) &&
               (!norm || norm_args(*norm, &na));
  Tensor wb;
  if (fused) {
    wb = bf16_weight(router.w, router.scale, router.block_n, router.block_k);
    fused = wb.ndim == 2 && wb.is_contiguous() && aligned16(wb.data);
  }
  if (!fused) return false;
  Prof prof_scope(this, norm ? "norm_moe_gate" : "moe_gate");
  GateArgs g{};
  g.norm = na;
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
  // No plan where the few-token kernels follow (they need none).
  const bool plan = tab ? !few_token_path(x, p.top_k, *tab) : T > 1 || !token_experts_;
  if (plan && L.total > gate_plan_capacity_) {
    BELUGA_CHECK(!capturing(S(stream_)), "moe_gate: the plan buffer must grow before graph capture");
    gate_plan_buf_ = alloc_persistent(DType::kI32, {L.total}).ptr<int>();
    gate_plan_capacity_ = L.total;
  }
  g.plan = plan ? gate_plan_buf_ : nullptr;
  // One token (up to 4: a K=3 verify step's rows): the kernel sized for them (fewer registers, so more
  // shared-expert blocks fit).
  const int variant = T == 1 ? 0 : T <= 4 ? 1 : 2;
  const auto kernel = norm ? (variant == 0   ? moe_gate_kernel<true, 1>
                              : variant == 1 ? moe_gate_kernel<true, 4>
                                             : moe_gate_kernel<true, kGateTok>)
                           : (variant == 0   ? moe_gate_kernel<false, 1>
                              : variant == 1 ? moe_gate_kernel<false, 4>
                                             : moe_gate_kernel<false, kGateTok>);
  int shared_blocks = 0;
  static_assert(kTokMaxTokens <= kGateTok, "the few-token path's tokens are one token group");
  if (tab && norm && tab->i_shared > 0 && T <= kTokMaxTokens) {
    // As many shared-expert blocks as fit beside the router's E at once.
    GateOccupancy& occ = gate_occupancy_[size_t(variant)];  // per kernel: verify and MTP steps alternate
    if (smem != occ.smem) {
      BELUGA_CUDA_CHECK(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ.blocks, kernel, kGateThreads, smem));
      occ.smem = smem;
    }
    g.tok = token_args(x, ids, weights, *tab, true, H);
    shared_blocks = int(std::clamp<int64_t>(int64_t(sm_count_) * std::max(occ.blocks, 1) - E, 1,
                                            ceil_div(int64_t(T) * tab->i_shared, kGateWarps)));
  }
  const dim3 grid(unsigned(E + shared_blocks), unsigned(ceil_div(T, kGateTok)));
  launch(kernel, grid, kGateThreads, smem, S(stream_), g);
  BELUGA_LAUNCH_CHECK();
  scratch_release(mark);
  if (plan) gate_plan_ = {ids.data, T, p.top_k, E};
  return true;
}

}  // namespace beluga
