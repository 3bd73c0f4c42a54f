// A few tokens' experts (batch-1 decode; a verify step's 2-8 rows where the layer's experts sit in L2)
// without a row plan or a combine kernel. Gate-up streams each token's K routed experts' and the shared
// expert's hidden units as one flat list spread evenly over the SMs (the planned path gives each expert
// its own blocks, so the 2x wider shared expert sets its length), or only the routed ones when the fused
// gate ran the shared expert beside the routing (CudaOps::moe); down computes each output unit for all
// of a token's rows in one block and sums them with the routing weights. A token's results do not depend
// on the others: each dot runs in the same order whatever T. Each routed dot runs in the planned path's
// order; the shared expert's down dot is summed in pieces (load balance), so results match the planned
// path to F32 rounding, not bit for bit.
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

// Slot k's expert: lane k of `lane_ids` holds the token's ids[k] (K <= 32), the shared expert is slot K.
__device__ __forceinline__ int slot_expert(const TokenArgs& a, int lane_ids, int k) {
  const int e = __shfl_sync(0xffffffffu, lane_ids, k & 31);
  return k < a.K ? e : a.ne - 1;
}

// The routed slots' units of every token, and the shared expert's unless `shared_done` (the fused gate
// ran them): token t's units are items t * per .. (t + 1) * per - 1 of the list.
__global__ void __launch_bounds__(kTokThreads) token_gate_up_kernel(TokenArgs a, bool shared_done) {
  pdl_entry();
  const int warp = threadIdx.x >> 5;
  const int routed = a.K * a.I, per = routed + (shared_done ? 0 : a.Is), units = a.T * per;
  for (int g = blockIdx.x * kTokWarps + warp; g < units; g += gridDim.x * kTokWarps) {
    const int t = g / per, r = g - t * per;
    const int k = r < routed ? r / a.I : a.K, u = r < routed ? r - k * a.I : r - routed;
    const int e = k < a.K ? __ldg(a.ids + int64_t(t) * a.K + k) : a.ne - 1;
    token_gate_up_unit(a, reinterpret_cast<const uint4*>(a.x + t * a.ldx), t * (a.K + 1) + k, u, e);
  }
}

// Block (x, t): kTokDownUnits output units of token t.
template <int U>
__global__ void __launch_bounds__(kTokThreads) token_down_kernel(TokenArgs a) {
  __shared__ float part[kTokMaxRows][kTokDownUnits];
  pdl_entry();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t = int(blockIdx.y);
  const int32_t* ids = a.ids + int64_t(t) * a.K;
  const float* w = a.w + int64_t(t) * a.K;
  const int lane_ids = lane < a.K ? __ldg(ids + lane) : 0;
  const bf16* h = a.h + int64_t(t) * (a.K + 1) * a.ldh;
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
    const uint4* hr = reinterpret_cast<const uint4*>(h + int64_t(routed ? k : a.K) * a.ldh + off);
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
    for (int k = 0; k < a.K; ++k) s += w[k] * part[k][threadIdx.x];
    for (int k = a.K; k < rows; ++k) s += part[k][threadIdx.x];
    a.out[int64_t(t) * a.ldo + d] = __float2bfloat16(s);
  }
}

}  // namespace

bool CudaOps::few_token_path(const Tensor& x, int K, const ExpertTable& tab) const {
  const int64_t T = x.shape[0];
  if (!(token_experts_ && T >= 1 && T <= kTokMaxTokens && K <= 32 && tab.i_routed > 0 &&
        tab.d == x.shape[1] && aligned16(x.data) && x.stride[0] % 8 == 0))
    return false;
  // Several tokens re-read the experts they share (the planned path streams each expert once): only
  // where the layer's experts fit in half the L2, so the re-reads hit it. The demo model's 3.5 MB
  // layer: a K=3 verify step's MoE in 3 kernels instead of 4 (the tile path's gate with its plan,
  // gate-up, down, combine: 26.6 us under ncu, H100 run 353), its verify forward 300 -> 266 us and
  // fixed K=3 at batch 1 1.44-1.48x -> 1.58-1.59x plain (run 354); V2-Lite's 1.1 GB keeps the planned
  // GEMV.
  const int routed = tab.ne - (tab.i_shared > 0 ? 1 : 0);
  const int64_t bytes = 3 * int64_t(tab.d) * (int64_t(routed) * tab.i_routed + tab.i_shared) * 2;
  return T == 1 || 2 * bytes <= l2_bytes_;
}

bool CudaOps::token_experts(Tensor out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                            const ExpertTable& tab, bool shared, Tensor H, bool shared_done) {
  const int K = int(ids.shape[1]), T = int(x.shape[0]);
  if (!few_token_path(x, K, tab) || out.stride[1] != 1) return false;
  TokenArgs a = token_args(x, ids, weights, tab, shared,
                           H.empty() ? scratch(DType::kBF16, {int64_t(T) * (K + 1), tab.i_max}) : H);
  a.out = out.ptr<bf16>();
  a.ldo = out.stride[0];
  cudaStream_t st = S(stream_);
  // Gate-up: as many blocks as fit at once (the warps stride over the units), so no second wave.
  if (token_gate_up_blocks_ == 0) {  // per SM, on this CudaOps' device
    BELUGA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&token_gate_up_blocks_,
                                                                    token_gate_up_kernel, kTokThreads, 0));
    token_gate_up_blocks_ = std::max(token_gate_up_blocks_, 1);
  }
  const int64_t units = int64_t(T) * (K * a.I + (shared_done ? 0 : a.Is));
  const int grid =
      int(std::min<int64_t>(ceil_div(units, kTokWarps), int64_t(sm_count_) * token_gate_up_blocks_));
  launch(token_gate_up_kernel, grid, kTokThreads, 0, st, a, shared_done);
  BELUGA_LAUNCH_CHECK();
  launch(token_down_kernel<8>, dim3(unsigned(ceil_div(a.D, kTokDownUnits)), unsigned(T)), kTokThreads, 0, st,
         a);
  BELUGA_LAUNCH_CHECK();
  return true;
}

}  // namespace beluga
