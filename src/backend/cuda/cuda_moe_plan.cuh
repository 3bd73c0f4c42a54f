// The expert plan of a MoE layer (token rows grouped by expert), shared by moe_experts' plan kernel
// and the fused gate, which builds it for the moe_experts that follows.
#pragma once

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

// ---- plan: rows grouped by expert ----
// start[e]: first row of expert e; tile_start[e]: first BM-row tile; row_token[r]: token of row r;
// entry_row[t*K+i]: row of (token t, choice i). The shared expert (index E) takes every token.
// One block builds it; `cnt` is 2 ne ints of shared memory. ids are read past L1: the fused gate
// builds the plan from ids that other blocks wrote.
__device__ inline void build_plan(const int32_t* ids, int T, int K, int E, int ne, int bm, int* start,
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

}  // namespace beluga::cuda
