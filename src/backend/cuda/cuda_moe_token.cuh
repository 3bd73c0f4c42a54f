// A few tokens' experts (batch-1 decode, a verify step's rows): the arguments and the gate-up of one
// hidden unit, shared by the expert kernels (cuda_moe_token.cu) and the fused gate, whose extra blocks
// run the shared expert's units while the router blocks route (cuda_moe_route.cu).
#pragma once

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga::cuda {

constexpr int kTokThreads = 256, kTokWarps = kTokThreads / 32;
// Tokens the unplanned kernels take (one fused gate's token group: kGateTok).
constexpr int kTokMaxTokens = 8;
constexpr int kTokGateUpLoads = 4;  // 16-byte loads in flight per lane and matrix

struct TokenArgs {
  const bf16* x;  // [T, ldx]: the tokens' normalized rows
  int64_t ldx;
  const int32_t* ids;       // [T, K]
  const float* w;           // [T, K]: routing weights (scaling included)
  const void* const* ptrs;  // the expert table's gate[ne], up[ne], down[ne]
  int ne, T, K, D, I, Is;   // routed width I; shared width Is (0: none; the table's last expert)
  // [T (K + 1), ldh]: silu(gate) * up of token t's slot k in row t (K + 1) + k; slot K is the shared
  // expert.
  bf16* h;
  int ldh;
  bf16* out;  // [T, ldo]
  int64_t ldo;
};

// One warp: hidden unit u of expert e for one token's row x, h[row][u] = silu(gate_u . x) * (up_u . x).
// x may be in shared memory (the fused gate's normalized rows) or global; the sums run in the same order
// either way.
__device__ __forceinline__ void token_gate_up_unit(const TokenArgs& a, const uint4* x, int row, int u,
                                                   int e) {
  constexpr int U = kTokGateUpLoads;
  const int lane = threadIdx.x & 31, K8 = a.D / 8;
  const bf16* wg = static_cast<const bf16*>(a.ptrs[e]) + int64_t(u) * a.D;
  const bf16* wu = static_cast<const bf16*>(a.ptrs[a.ne + e]) + int64_t(u) * a.D;
  float ag = 0, au = 0;
  for (int k0 = lane; k0 < K8; k0 += 32 * U) {
    uint4 gv[U], uv[U];
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const bool ok = k0 + 32 * j < K8;
      gv[j] = ok ? ld_stream(wg + (k0 + 32 * j) * 8) : uint4{};
      uv[j] = ok ? ld_stream(wu + (k0 + 32 * j) * 8) : uint4{};
    }
#pragma unroll
    for (int j = 0; j < U; ++j) {
      const int k8 = k0 + 32 * j;
      if (k8 >= K8) break;
      const uint4 xv = x[k8];
      ag += dot8(gv[j], xv);
      au += dot8(uv[j], xv);
    }
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) a.h[int64_t(row) * a.ldh + u] = __float2bfloat16(ag / (1.0f + __expf(-ag)) * au);
}

// The arguments for tokens x's experts (ids, weights [T, K]) over `tab`, with H [T (K + 1), >= i_max].
inline TokenArgs token_args(const Tensor& x, const Tensor& ids, const Tensor& weights,
                            const CudaOps::ExpertTable& tab, bool shared, Tensor H) {
  TokenArgs a{};
  a.x = x.ptr<const bf16>();
  a.ldx = x.stride[0];
  a.ids = ids.ptr<const int32_t>();
  a.w = weights.ptr<const float>();
  a.ptrs = tab.ptrs;
  a.ne = tab.ne;
  a.T = int(x.shape[0]);
  a.K = int(ids.shape[1]);
  a.D = tab.d;
  a.I = tab.i_routed;
  a.Is = shared ? tab.i_shared : 0;
  a.h = H.ptr<bf16>();
  a.ldh = int(H.stride[0]);
  return a;
}

}  // namespace beluga::cuda
