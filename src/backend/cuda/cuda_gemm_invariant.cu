// The batch-invariant GEMM (cuda_gemm_invariant.h): tiles of BM token rows x BN weight rows, K in
// 64-wide stages through shared memory (cp.async), mma.sync m16n8k16 with F32 accumulators.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_invariant.h"
#include "backend/cuda/cuda_kernel_config.h"
#include "backend/cuda/cuda_mma_stage.cuh"

namespace beluga::cuda {

namespace {

// One K stage for every tile shape: the k16 steps of an element then come in the same order
// whatever the shape (and a tail past K is the same zero padding).
constexpr int kBK = 64, kLd = kBK + 8, kParts = kBK / 8;

template <int BM, int BN, int kStages>
constexpr int tile_smem() {
  return kStages * (BM + BN) * kLd * 2;
}

// kWM x kWN warps, each owning a (BM / kWM) x (BN / kWN) piece of the tile over the whole K.
template <int BM, int BN, int kWM, int kWN, int kStages>
__global__ void __launch_bounds__(kWM* kWN * 32) invariant_gemm_kernel(InvariantGemm g) {
  pdl_entry();
  constexpr int kThreads = kWM * kWN * 32, WTM = BM / kWM, WTN = BN / kWN, MT = WTM / 16, NT = WTN / 8;
  static_assert(WTM % 16 == 0 && WTN % 16 == 0, "warp tiles of whole m16 rows and n16 column pairs");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* As = reinterpret_cast<bf16*>(smem_raw);
  bf16* Bs = As + kStages * BM * kLd;
  const int z = blockIdx.z, m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
  const bf16* x = static_cast<const bf16*>(g.x) + z * g.x_z;
  const bf16* w = static_cast<const bf16*>(g.w) + z * g.w_z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp / kWN, wn = warp % kWN;
  const int K = g.K, KT = (K + kBK - 1) / kBK;

  auto load = [&](int stage, int kt) {
    const int k0 = kt * kBK;
    bf16* as = As + stage * BM * kLd;
    bf16* bs = Bs + stage * BN * kLd;
    for (int c = tid; c < BM * kParts; c += kThreads) {
      const int r = c / kParts, part = (c % kParts) * 8;
      const bool ok = m0 + r < g.M && k0 + part < K;
      cp_async16(as + r * kLd + part, ok ? x + int64_t(m0 + r) * g.ldx + k0 + part : x, ok);
    }
    for (int c = tid; c < BN * kParts; c += kThreads) {
      const int r = c / kParts, part = (c % kParts) * 8;
      const bool ok = n0 + r < g.N && k0 + part < K;
      cp_async16(bs + r * kLd + part, ok ? w + int64_t(n0 + r) * g.ldw + k0 + part : w, ok);
    }
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[i][j][k] = 0.0f;

  cp_async_pipeline<kStages>(KT, load, [&](int buf) {
    mma_stage<MT, NT, kBK, kLd>(acc, As + buf * BM * kLd, wm * WTM, Bs + buf * BN * kLd, wn * WTN, lane);
  });

  const int gr = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = m0 + wm * WTM + mt * 16 + gr + half * 8;
      if (r >= g.M) continue;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int col = n0 + wn * WTN + nt * 8 + 2 * t4 + q;
          if (col >= g.N) continue;
          const int64_t i = z * g.out_z + int64_t(r) * g.ldo + col;
          const float v = acc[mt][nt][half * 2 + q];
          if (g.out_f32)
            static_cast<float*>(g.out)[i] = v;
          else
            static_cast<bf16*>(g.out)[i] = __float2bfloat16(v);
        }
    }
}

// Decode rows (M <= 16): narrow tiles so that more blocks stream the weights, four stages in flight.
#define BELUGA_IG_SMALL 16, 64, 1, 4, 4
#define BELUGA_IG_MID 64, 128, 2, 4, 3
#define BELUGA_IG_LARGE 128, 128, 2, 4, 3

template <int BM, int BN, int kWM, int kWN, int kStages>
void launch_tiles(const InvariantGemm& g, cudaStream_t st) {
  const dim3 grid(unsigned(ceil_div(g.N, BN)), unsigned(ceil_div(g.M, BM)), unsigned(g.batch));
  launch(invariant_gemm_kernel<BM, BN, kWM, kWN, kStages>, grid, kWM * kWN * 32,
         size_t(tile_smem<BM, BN, kStages>()), st, g);
  BELUGA_LAUNCH_CHECK();
}

template <int BM, int BN, int kWM, int kWN, int kStages>
void allow_tiles() {
  allow_dynamic_smem(invariant_gemm_kernel<BM, BN, kWM, kWN, kStages>, tile_smem<BM, BN, kStages>());
}

}  // namespace

void configure_invariant_gemm_kernels() {
  allow_tiles<BELUGA_IG_SMALL>();
  allow_tiles<BELUGA_IG_MID>();
  allow_tiles<BELUGA_IG_LARGE>();
}

bool invariant_gemm_ok(const InvariantGemm& g) {
  auto m8 = [](int64_t v) { return v % 8 == 0; };
  return g.K % 8 == 0 && m8(g.ldx) && m8(g.ldw) && m8(g.x_z) && m8(g.w_z) && aligned16(g.x) &&
         aligned16(g.w) && g.M >= 0 && g.N > 0 && g.batch >= 1 && g.batch <= 65535;
}

void invariant_gemm(const InvariantGemm& g, void* stream) {
  BELUGA_CHECK(invariant_gemm_ok(g), "invariant_gemm: operands not in 16-byte rows (K ", g.K, ")");
  if (g.M == 0) return;
  cudaStream_t st = S(stream);
  if (g.M <= 16)
    launch_tiles<BELUGA_IG_SMALL>(g, st);
  else if (g.M <= 64)
    launch_tiles<BELUGA_IG_MID>(g, st);
  else
    launch_tiles<BELUGA_IG_LARGE>(g, st);
}

#undef BELUGA_IG_SMALL
#undef BELUGA_IG_MID
#undef BELUGA_IG_LARGE

}  // namespace beluga::cuda
