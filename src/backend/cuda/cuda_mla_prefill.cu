// MLA prefill attention on Hopper warpgroup MMAs. The mma.sync kernel it replaced ran the 8K prefill's
// attention at ~170 TFLOP/s, a third of the step (bench/NOTES.md run 54): every warp streamed its K/V
// fragments through ldmatrix for 16 query rows. Here three warpgroups of 64 query rows read K and
// v^T straight from shared memory (wgmma descriptors, cuda_wgmma.cuh): S = Q K^T as m64n64k16 over the
// 192-wide head (12 steps), the online softmax in registers, O += P v as m64n128k16 with P from
// registers. v is transposed per head first (its key-major rows would make v an MN-major operand).
// Tried and not kept (run 60): S for the next tile on the tensor cores during this tile's softmax
// (FlashAttention-3's intra-warpgroup overlap), and Q in registers for S: both unchanged at 121 ms.
#include <cmath>

#include "backend/cuda/cuda_mla_prefill.cuh"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_wgmma.cuh"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kPK = 64, kPStages = 3;
// Warpgroups of 64 query rows per block: 3 (148 registers, 12 warps per SM) ran the 8K prefill in 116.2
// ms against 121.3-121.8 with 2 (ncu of the 2-warpgroup kernel: 2 warps per scheduler, 0.68 eligible,
// 44 % of issue slots; bench/NOTES.md run 61). 4 would need <= 128 registers.
constexpr int kPrefillWG = 3;
// kWG warpgroups per block; Q in 64-column slices of 64 kWG rows x 128 bytes.
template <int kWG>
__host__ __device__ constexpr int q_sub() {
  return kWG * 64 * 128;
}
constexpr int kKSub = kPK * 128;                    // one 64-column slice of a K tile
constexpr int kKBytes = (kPrefillDk / 64) * kKSub;  // 24 KB
constexpr int kVBytes = kPrefillDv * 128;           // v^T tile: 128 rows (v dims) x 64 keys
constexpr int kStageBytes = kKBytes + kVBytes;
template <int kWG>
constexpr int prefill_smem() {
  return (kPrefillDk / 64) * q_sub<kWG>() + kPStages * kStageBytes + 1024;
}

// Row of sequence s's first key in kv / kpe (sequences' cached + new keys, concatenated).
__device__ __forceinline__ int64_t key_base(const int32_t* qs, const int32_t* ctx, int s) {
  int64_t b = qs[s];
  for (int i = 0; i < s; ++i) b += ctx[i];
  return b;
}
// Column of sequence s's first key in v^T (each sequence's keys rounded up to 64).
__device__ __forceinline__ int64_t vt_base(const int32_t* qs, const int32_t* ctx, int s) {
  int64_t b = 0;
  for (int i = 0; i < s; ++i) b += (int64_t(ctx[i]) + qs[i + 1] - qs[i] + 63) / 64 * 64;
  return b;
}

// v^T[h][d][vt_base + j] = kv[key_base + j][h][nope + d]; zeros for j past the sequence's keys up to
// the next multiple of 64 (the attention kernel reads whole 64-key tiles, and 0 x garbage may be NaN).
__global__ void __launch_bounds__(256) vt_transpose_kernel(PrefillArgs a) {
  pdl_entry();
  __shared__ bf16 tile[64][kPrefillDv + 8];  // keys x dims
  const int s = blockIdx.z, h = blockIdx.y, j0 = blockIdx.x * 64;
  const int n = a.ctx[s] + a.qs[s + 1] - a.qs[s];
  if (j0 >= n) return;
  const int64_t base = key_base(a.qs, a.ctx, s), vb = vt_base(a.qs, a.ctx, s);
  for (int c = threadIdx.x; c < 64 * (kPrefillDv / 8); c += 256) {
    const int key = c / (kPrefillDv / 8), part = c % (kPrefillDv / 8), j = j0 + key;
    uint4 v{};
    if (j < n)
      v = *reinterpret_cast<const uint4*>(a.kv + (base + j) * a.kv0 + h * a.kv1 + kPrefillNope + part * 8);
    *reinterpret_cast<uint4*>(&tile[key][part * 8]) = v;
  }
  __syncthreads();
  for (int c = threadIdx.x; c < kPrefillDv * 8; c += 256) {
    const int d = c >> 3, kc = c & 7;
    uint4 v;
    bf16* e = reinterpret_cast<bf16*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = tile[kc * 8 + i][d];
    *reinterpret_cast<uint4*>(a.vt + (int64_t(h) * kPrefillDv + d) * a.ldvt + vb + j0 + kc * 8) = v;
  }
}

template <int kWG>
__global__ void __launch_bounds__(kWG * 128, 1) mla_prefill_wgmma_kernel(PrefillArgs a) {
  constexpr int kPQ = kWG * 64, kPThreads = kWG * 128, kQSub = q_sub<kWG>();
  pdl_entry();
  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t sQ = (raw + 1023) & ~1023u, sS = sQ + (kPrefillDk / 64) * kQSub;
  unsigned char* const gQ = smem_raw + (sQ - raw);
  unsigned char* const gS = gQ + (sS - sQ);
  // Causal: later query blocks see more keys, so they go first and the short ones fill the tail.
  const int s = blockIdx.z, h = blockIdx.y, q0 = (gridDim.x - 1 - blockIdx.x) * kPQ;
  const int qlen = a.qs[s + 1] - a.qs[s];
  if (q0 >= qlen) return;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
            t4 = lane & 3;
  const int ctx = a.ctx[s];
  const int64_t base = key_base(a.qs, a.ctx, s), vb = vt_base(a.qs, a.ctx, s);
  const int nkeys = ctx + min(q0 + kPQ, qlen);
  const int64_t qrow0 = a.qs[s] + q0;
  constexpr int kParts = kPrefillDk / 8;  // 16-byte chunks of a q/k row
  for (int c = tid; c < kPQ * kParts; c += kPThreads) {
    const int r = c / kParts, p = c % kParts;
    const bool ok = q0 + r < qlen;
    cp_async16(gQ + (p >> 3) * kQSub + sw128_offset(r, p & 7),
               ok ? a.q + (qrow0 + r) * a.q0 + h * a.q1 + p * 8 : a.q, ok);
  }
  auto load = [&](int stage, int kt0) {
    unsigned char* ks = gS + stage * kStageBytes;
    unsigned char* vs = ks + kKBytes;
    for (int c = tid; c < kPK * kParts; c += kPThreads) {
      const int key = c / kParts, p = c % kParts, j = kt0 + key;
      const bool ok = j < nkeys;
      const bf16* src = a.kv;
      if (ok)
        src = p < kPrefillNope / 8 ? a.kv + (base + j) * a.kv0 + h * a.kv1 + p * 8
                                   : a.kpe + (base + j) * a.kpe0 + (p - kPrefillNope / 8) * 8;
      cp_async16(ks + (p >> 3) * kKSub + sw128_offset(key, p & 7), src, ok);
    }
    for (int c = tid; c < kPrefillDv * 8; c += kPThreads) {
      const int d = c >> 3, p = c & 7;
      cp_async16(vs + sw128_offset(d, p), a.vt + (int64_t(h) * kPrefillDv + d) * a.ldvt + vb + kt0 + p * 8,
                 true);
    }
  };
  const int ntiles = (nkeys + kPK - 1) / kPK;
  // Each iteration waits for its own products, so the buffer loaded at kt (read at kt - 1) is free.
  constexpr int kAhead = kPStages - 1;
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < ntiles) load(st, st * kPK);
    cp_async_commit();  // Q rides in the first group
  }

  const int warp_row0 = q0 + wg * 64 + warp * 16;  // this warp's first query row (index in the chunk)
  const int qi0 = warp_row0 + g, qi1 = qi0 + 8;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  for (int kt = 0; kt < ntiles; ++kt) {
    const int kt0 = kt * kPK;
    cp_async_wait<kAhead - 1>();
    fence_async_shared();
    __syncthreads();  // everyone's chunks of tile kt; every product of tile kt - 1 is done
    if (kt + kAhead < ntiles) load((kt + kAhead) % kPStages, (kt + kAhead) * kPK);
    cp_async_commit();
    // A warpgroup whose rows all precede the tile's first key has nothing to add.
    if (kt0 > ctx + q0 + wg * 64 + 63) continue;
    const uint32_t ks = sS + (kt % kPStages) * kStageBytes, vs = ks + kKBytes;
    float sacc[32];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPrefillDk / 16; ++kk)
      wgmma_m64n64k16(sacc, sw128_desc(sQ + (kk >> 2) * kQSub + wg * 64 * 128) + 2 * (kk & 3),
                      sw128_desc(ks + (kk >> 2) * kKSub) + 2 * (kk & 3), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();

    // Maxima on the raw scores (the scale is positive), the scale folded into each exponent's FMA.
    float rm[2] = {-INFINITY, -INFINITY};
    // Only tiles that reach past the warp's first row (the diagonal) or past the keys need the mask.
    const bool full = kt0 + kPK <= nkeys && kt0 + kPK - 1 <= ctx + warp_row0;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float& v = sacc[4 * nt + q];
        if (!full) {
          const int j = kt0 + nt * 8 + 2 * t4 + (q & 1);
          if (j >= nkeys || j > ctx + (q < 2 ? qi0 : qi1)) v = -INFINITY;
        }
        rm[q >> 1] = fmaxf(rm[q >> 1], v);
      }
    float alpha[2], mu[2];  // mu: the running maximum in log2 units, negated
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      rm[r] = fmaxf(rm[r], __shfl_xor_sync(0xffffffffu, rm[r], 1));
      rm[r] = fmaxf(rm[r], __shfl_xor_sync(0xffffffffu, rm[r], 2));
      const float m_new = fmaxf(m[r], rm[r]);
      mu[r] = m_new == -INFINITY ? 0.0f : -m_new * a.scale_log2;
      alpha[r] = exp2f(fmaf(m[r], a.scale_log2, mu[r]));
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[4 * j] *= alpha[0];
      o[4 * j + 1] *= alpha[0];
      o[4 * j + 2] *= alpha[1];
      o[4 * j + 3] *= alpha[1];
    }
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < kPK / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float p = exp2f(fmaf(sacc[8 * kk + i], a.scale_log2, mu[(i >> 1) & 1]));
        sacc[8 * kk + i] = p;
        l[(i >> 1) & 1] += p;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[kk][i] = pack_bf16(sacc[8 * kk + 2 * i], sacc[8 * kk + 2 * i + 1]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPK / 16; ++kk) wgmma_m64n128k16_rs(o, pa[kk], sw128_desc(vs) + 2 * kk);
    wgmma_commit();
    wgmma_wait<0>();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = r == 0 ? qi0 : qi1;
    if (qi >= qlen) continue;
    const float inv = 1.0f / l[r];
    bf16* op = a.out + (a.qs[s] + qi) * a.o0 + h * a.o1 + 2 * t4;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<__nv_bfloat162*>(op + j * 8) =
          __floats2bfloat162_rn(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
  }
}

template <int kWG>
void launch_prefill(const PrefillArgs& a, int max_q, int H, int num_seqs, cudaStream_t st) {
  constexpr int smem = prefill_smem<kWG>();
  static bool configured = false;
  if (!configured) {
    BELUGA_CUDA_CHECK(cudaFuncSetAttribute(mla_prefill_wgmma_kernel<kWG>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    configured = true;
  }
  launch(mla_prefill_wgmma_kernel<kWG>, dim3(int(ceil_div(max_q, kWG * 64)), H, num_seqs), kWG * 128, smem,
         st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace

namespace cuda {

int64_t prefill_vt_len(const AttnMeta& m) {
  int64_t n = 0;
  for (int s = 0; s < m.num_seqs; ++s)
    n += (int64_t(m.h_context_len[s]) + m.h_query_start[s + 1] - m.h_query_start[s] + 63) / 64 * 64;
  return n;
}

void run_mla_prefill_wgmma(const PrefillArgs& a, int max_q, int max_keys_, int H, int num_seqs,
                           cudaStream_t st) {
  launch(vt_transpose_kernel, dim3(int(ceil_div(max_keys_, 64)), H, num_seqs), 256, 0, st, a);
  BELUGA_LAUNCH_CHECK();
  launch_prefill<kPrefillWG>(a, max_q, H, num_seqs, st);
}

}  // namespace cuda

}  // namespace beluga
