// One token's experts (batch-1 decode) without a row plan or a combine kernel. Gate-up streams the K
// routed experts' and the shared expert's hidden units as one flat list spread evenly over the SMs
// (the planned path gives each expert its own blocks, so the 2x wider shared expert sets its length),
// or only the routed ones when the fused gate ran the shared expert beside the routing (CudaOps::moe);
// down computes each output unit for all of the token's rows in one block and sums them with the
// routing weights. Each routed dot runs in the planned path's order; the shared expert's down dot is
// summed in pieces (load balance), so results match the planned path to F32 rounding, not bit for bit.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_moe_token.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

// Output units per down block: 4 gives V2-Lite 512 blocks (one wave at 4 per SM), each warp a few
// (row, unit) dots of 1408 inputs, which one round of 8 loads per lane covers.
constexpr int kTokDownUnits = 4;
constexpr int kTokMaxRows = 40;  // K <= 32 routed rows and the shared one's pieces

// Slot k's expert: lane k of `lane_ids` holds ids[k] (K <= 32), the shared expert is slot K.
__device__ __forceinline__ int slot_expert(const TokenArgs& a, int lane_ids, int k) {
  const int e = __shfl_sync(0xffffffffu, lane_ids, k & 31);
  return k < a.K ? e : a.ne - 1;
}

// The routed slots' units, and the shared expert's unless `shared_done` (the fused gate ran them).
__global__ void __launch_bounds__(kTokThreads) token_gate_up_kernel(TokenArgs a, bool shared_done) {
  pdl_entry();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lane_ids = lane < a.K ? __ldg(a.ids + lane) : 0;
  const int routed = a.K * a.I, units = routed + (shared_done ? 0 : a.Is);
  const uint4* x = reinterpret_cast<const uint4*>(a.x);
  for (int g = blockIdx.x * kTokWarps + warp; g < units; g += gridDim.x * kTokWarps) {
    const int k = g < routed ? g / a.I : a.K, u = g < routed ? g - k * a.I : g - routed;
    token_gate_up_unit(a, x, k, u, slot_expert(a, lane_ids, k));
  }
}

template <int U>
__global__ void __launch_bounds__(kTokThreads) token_down_kernel(TokenArgs a) {
  __shared__ float part[kTokMaxRows][kTokDownUnits];
  pdl_entry();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int lane_ids = lane < a.K ? __ldg(a.ids + lane) : 0;
  // The shared expert's row in pieces as long as a routed row (V2-Lite: 2 x 1408), so every warp
  // gets the same number of equal dots: 8 rows x 4 units over 8 warps, where the whole 2816-long row
  // made 4 warps do 5 rounds of loads and 4 do 3 (down 17.7 -> see bench/NOTES.md).
  const int pieces = a.Is == 0 ? 0 : a.Is % a.I == 0 && a.K + a.Is / a.I <= kTokMaxRows ? a.Is / a.I : 1;
  const int plen = pieces ? a.Is / pieces : 0;
  const int rows = a.K + pieces, d0 = blockIdx.x * kTokDownUnits;
  for (int p = warp; p < rows * kTokDownUnits; p += kTokWarps) {
    const int k = p / kTokDownUnits, j = p % kTokDownUnits, d = d0 + j;
    const int e = slot_expert(a, lane_ids, k);
    if (d >= a.D) continue;
    const bool routed = k < a.K;
    const int len = routed ? a.I : plen, K8 = len / 8, off = routed ? 0 : (k - a.K) * plen;
    const bf16* wr =
        static_cast<const bf16*>(a.ptrs[2 * a.ne + e]) + int64_t(d) * (routed ? a.I : a.Is) + off;
    const uint4* hr = reinterpret_cast<const uint4*>(a.h + int64_t(routed ? k : a.K) * a.ldh + off);
    float acc = 0;
    for (int k0 = lane; k0 < K8; k0 += 32 * U) {
      uint4 wv[U];
#pragma unroll
      for (int i = 0; i < U; ++i) wv[i] = k0 + 32 * i < K8 ? ld_stream(wr + (k0 + 32 * i) * 8) : uint4{};
#pragma unroll
      for (int i = 0; i < U; ++i) {
        const int k8 = k0 + 32 * i;
        if (k8 >= K8) break;
        acc += dot8(wv[i], __ldg(hr + k8));
      }
    }
    acc = warp_sum(acc);
    if (lane == 0) part[k][j] = acc;
  }
  __syncthreads();
  const int d = d0 + int(threadIdx.x);
  if (threadIdx.x < kTokDownUnits && d < a.D) {
    float s = 0;  // moe_combine_kernel's order, the shared pieces in order after the routed rows
    for (int k = 0; k < a.K; ++k) s += a.w[k] * part[k][threadIdx.x];
    for (int k = a.K; k < rows; ++k) s += part[k][threadIdx.x];
    a.out[d] = __float2bfloat16(s);
  }
}

}  // namespace

bool CudaOps::one_token_path(const Tensor& x, int K, const ExpertTable& tab) const {
  return token_experts_ && x.shape[0] == 1 && K <= 32 && tab.i_routed > 0 && tab.d == x.shape[1] &&
         aligned16(x.data);
}

bool CudaOps::token_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                            const ExpertTable& tab, bool shared, Tensor H, bool shared_done) {
  const int K = int(ids.shape[1]);
  if (!one_token_path(x, K, tab)) return false;
  TokenArgs a =
      token_args(x, ids, weights, tab, shared, H.empty() ? scratch(DType::kBF16, {K + 1, tab.i_max}) : H);
  a.out = out.ptr<bf16>();
  cudaStream_t st = S(stream_);
  // Gate-up: as many blocks as fit at once (the warps stride over the units), so no second wave.
  if (token_gate_up_blocks_ == 0) {  // per SM, on this CudaOps' device
    BELUGA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&token_gate_up_blocks_,
                                                                    token_gate_up_kernel, kTokThreads, 0));
    token_gate_up_blocks_ = std::max(token_gate_up_blocks_, 1);
  }
  const int units = K * a.I + (shared_done ? 0 : a.Is);
  const int grid =
      int(std::min<int64_t>(ceil_div(units, kTokWarps), int64_t(sm_count_) * token_gate_up_blocks_));
  launch(token_gate_up_kernel, grid, kTokThreads, 0, st, a, shared_done);
  BELUGA_LAUNCH_CHECK();
  launch(token_down_kernel<8>, int(ceil_div(a.D, kTokDownUnits)), kTokThreads, 0, st, a);
  BELUGA_LAUNCH_CHECK();
  return true;
}

}  // namespace beluga
