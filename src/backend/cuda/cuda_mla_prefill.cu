// MLA prefill attention on Hopper warpgroup MMAs. The mma.sync kernel it replaced ran the 8K prefill's
// attention at ~170 TFLOP/s, a third of the step (bench/NOTES.md run 54): every warp streamed its K/V
// fragments through ldmatrix for 16 query rows. Here three warpgroups of 64 query rows read K and v
// straight from shared memory (wgmma descriptors, cuda_wgmma.cuh): S = Q K^T as m64n64k16 over the
// 192-wide head (12 steps), the online softmax in registers, O += P v as m64n128k16 with P from
// registers and v an MN-major operand in its key rows (a transpose kernel wrote v^T for a K-major
// operand before: ~10 us per layer at 2K, bench/NOTES.md run 90).
// Tried and not kept (run 60): S for the next tile on the tensor cores during this tile's softmax
// (FlashAttention-3's intra-warpgroup overlap), and Q in registers for S: both unchanged at 121 ms.
#include <algorithm>
#include <climits>
#include <cmath>
#include <functional>
#include <queue>
#include <vector>

#include "backend/cuda/cuda_kernel_config.h"
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
constexpr int kVBytes = kPK * kPrefillDv * 2;       // v tile: 64 keys x 128 dims, as 2 x 64-dim halves
constexpr int kVHalf = kPK * 128;                   // one 64-dim half: 64 key rows of 128 bytes
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

// 2^x on the special-function unit alone: exp2f also scales subnormal results (three more instructions
// per score); the probabilities it would keep below 2^-126 add nothing to a row's sum.
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <int kWG>
__global__ void __launch_bounds__(kWG * 128, 1) mla_prefill_wgmma_kernel(PrefillArgs a) {
  constexpr int kPQ = kWG * 64, kPThreads = kWG * 128, kQSub = q_sub<kWG>();
  pdl_entry();
  extern __shared__ unsigned char smem_raw[];
  const auto [sQ, sS, gQ, gS] = swizzled_regions(smem_raw, (kPrefillDk / 64) * kQSub);
  // Causal: later query blocks see more keys, so they go first (across all heads: blocks start in index
  // order) and the short ones fill the tail. Head-major order (run 81) left the longest blocks of the
  // last heads for the second wave and the SMs 55 % active. Blocks of a sequence, per head, in order of
  // their key tiles: whole query blocks and halves of split ones (two consecutive items) merged by size.
  const int H = a.heads, s = blockIdx.y, h = int(blockIdx.x) % H;
  const int qlen = a.qs[s + 1] - a.qs[s], ctx = a.ctx[s], nq = (qlen + kPQ - 1) / kPQ;
  auto tiles_of = [&](int i) { return (ctx + min((i + 1) * kPQ, qlen) + kPK - 1) / kPK; };
  int first_split = nq;  // tiles_of grows with i: the split query blocks are a suffix
  while (first_split > 0 && tiles_of(first_split - 1) > a.split_min) --first_split;
  int qb = -1, half = -1;
  for (int u = first_split - 1, v = nq - 1, k = int(blockIdx.x) / H; u >= 0 || v >= first_split;) {
    const int wu = u >= 0 ? tiles_of(u) : -1, wv = v >= first_split ? (tiles_of(v) + 1) / 2 : -1;
    if (wv >= wu) {
      if (k < 2) {
        qb = v;
        half = k;
        break;
      }
      k -= 2;
      --v;
    } else {
      if (k == 0) {
        qb = u;
        break;
      }
      --k;
      --u;
    }
  }
  if (qb < 0) return;
  const int q0 = qb * kPQ;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2,
            t4 = lane & 3;
  const int64_t base = key_base(a.qs, a.ctx, s);
  const int nkeys = ctx + min(q0 + kPQ, qlen);
  const int64_t qrow0 = a.qs[s] + q0;
  constexpr int kParts = kPrefillDk / 8;  // 16-byte chunks of a q/k row
  for (int c = tid; c < kPQ * kParts; c += kPThreads) {
    const int r = c / kParts, p = c % kParts;
    const bool ok = q0 + r < qlen;
    cp_async16(gQ + (p >> 3) * kQSub + sw128_offset(r, p & 7),
               ok ? a.q + (qrow0 + r) * a.q0 + h * a.q1 + p * 8 : a.q, ok);
  }
  // A thread copies the same chunks of every K / v tile, kPThreads / kParts (kPThreads / 16) keys apart
  // with one chunk column: its first source (at key 0) and shared-memory offset once here, so a tile's
  // loads are adds and a compare each (ncu, run 81: ~1000 instructions per warp per tile, the kernel
  // issue-bound at 30 % of its slots).
  constexpr int kKChunks = kPK * kParts / kPThreads, kKRowStep = kPThreads / kParts;
  constexpr int kVChunks = (kPK * 16 + kPThreads - 1) / kPThreads, kVRowStep = kPThreads / 16;
  static_assert(kPK * kParts % kPThreads == 0 && kPThreads % kParts == 0 && kKRowStep % 8 == 0 &&
                kVRowStep % 8 == 0);  // a multiple of 8 rows keeps the chunk's swizzle
  const int k_key = tid / kParts, k_part = tid % kParts;
  const bool nope = k_part < kPrefillNope / 8;
  const int64_t k_step = nope ? a.kv0 : a.kpe0;
  const bf16* const k_src = nope ? a.kv + (base + k_key) * a.kv0 + h * a.kv1 + k_part * 8
                                 : a.kpe + (base + k_key) * a.kpe0 + (k_part - kPrefillNope / 8) * 8;
  const uint32_t k_dst = (k_part >> 3) * kKSub + sw128_offset(k_key, k_part & 7);
  const int v_key = tid / 16, v_part = tid % 16;  // 16 chunks per key's 128 v dims
  const bf16* const v_src = a.kv + (base + v_key) * a.kv0 + h * a.kv1 + kPrefillNope + v_part * 8;
  const uint32_t v_dst = kKBytes + (v_part >> 3) * kVHalf + sw128_offset(v_key, v_part & 7);
  auto load = [&](int stage, int kt0) {
    unsigned char* ks = gS + stage * kStageBytes;
#pragma unroll
    for (int i = 0; i < kKChunks; ++i) {
      const bool ok = kt0 + k_key + i * kKRowStep < nkeys;
      cp_async16(ks + k_dst + i * kKRowStep * 128, ok ? k_src + (kt0 + i * kKRowStep) * k_step : a.kv, ok);
    }
#pragma unroll
    for (int i = 0; i < kVChunks; ++i) {
      const int key = v_key + i * kVRowStep;  // zeros past the keys: 0 x garbage may be NaN
      const bool ok = kt0 + key < nkeys;
      if (key < kPK)
        cp_async16(ks + v_dst + i * kVRowStep * 128, ok ? v_src + (kt0 + i * kVRowStep) * a.kv0 : a.kv, ok);
    }
  };
  const int ntiles = (nkeys + kPK - 1) / kPK;
  // This block's key tiles [kt_lo, kt_hi): all, or one half of a split query block.
  const int kt_lo = half == 1 ? ntiles / 2 : 0, kt_hi = half == 0 ? ntiles / 2 : ntiles;
  // Each iteration waits for its own products, so the buffer loaded at kt (read at kt - 1) is free.
  constexpr int kAhead = kPStages - 1;
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (kt_lo + st < kt_hi) load(st, (kt_lo + st) * kPK);
    cp_async_commit();  // Q rides in the first group
  }

  const int warp_row0 = q0 + wg * 64 + warp * 16;  // this warp's first query row (index in the chunk)
  const int qi0 = warp_row0 + g, qi1 = qi0 + 8;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.0f;
  for (int kt = kt_lo; kt < kt_hi; ++kt) {
    const int kt0 = kt * kPK, step = kt - kt_lo;
    cp_async_wait<kAhead - 1>();
    fence_async_shared();
    __syncthreads();  // everyone's chunks of tile kt; every product of tile kt - 1 is done
    if (kt + kAhead < kt_hi) load((step + kAhead) % kPStages, (kt + kAhead) * kPK);
    cp_async_commit();
    // A warpgroup whose rows all precede the tile's first key has nothing to add.
    if (kt0 > ctx + q0 + wg * 64 + 63) continue;
    const uint32_t ks = sS + (step % kPStages) * kStageBytes, vs = ks + kKBytes;
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
      alpha[r] = ex2_ftz(fmaf(m[r], a.scale_log2, mu[r]));
      m[r] = m_new;
      l[r] *= alpha[r];
    }
    // Once the rows' maxima settle, alpha is exactly 1 and the warp skips the 64 multiplications.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        o[4 * j] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
    }
    uint32_t pa[4][4];
#pragma unroll
    for (int kk = 0; kk < kPK / 16; ++kk) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float p = ex2_ftz(fmaf(sacc[8 * kk + i], a.scale_log2, mu[(i >> 1) & 1]));
        sacc[8 * kk + i] = p;
        l[(i >> 1) & 1] += p;
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[kk][i] = pack_bf16(sacc[8 * kk + 2 * i], sacc[8 * kk + 2 * i + 1]);
    }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPK / 16; ++kk)
      wgmma_m64n128k16_rs(o, pa[kk], sw128_mn_desc(vs + kk * 16 * 128, kVHalf));  // 16 key rows per step
    wgmma_commit();
    wgmma_wait<0>();
  }
  cp_async_wait<0>();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  if (half >= 0) {
    // Leave this half's unnormalized rows, maxima and sums; the second to finish merges both.
    const int slot = (s * H + h) * a.max_split + (qb - first_split);
    constexpr int kPartF4 = 17 * kPThreads;  // per half: o as 16 float4 per thread, then (m, l)
    float4* mine = reinterpret_cast<float4*>(a.part) + (int64_t(slot) * 2 + half) * kPartF4;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      mine[j * kPThreads + tid] = make_float4(o[4 * j], o[4 * j + 1], o[4 * j + 2], o[4 * j + 3]);
    mine[16 * kPThreads + tid] = make_float4(m[0], m[1], l[0], l[1]);
    __threadfence();
    __syncthreads();
    __shared__ int s_first;
    if (tid == 0) s_first = atomicAdd(a.counters + slot, 1) == 0;
    __syncthreads();
    if (s_first) return;
    __threadfence();
    const float4* other = reinterpret_cast<const float4*>(a.part) + (int64_t(slot) * 2 + 1 - half) * kPartF4;
    const float4 ml = __ldcg(other + 16 * kPThreads + tid);
    // Each half's term rounded on its own, then one addition: the same bits whichever half merges
    // (a contracted FMA would round differently depending on which term is this block's).
    auto mix = [](float own, float c_own, float oth, float c_oth) {
      return __fadd_rn(__fmul_rn(own, c_own), __fmul_rn(oth, c_oth));
    };
    float cm[2], co[2];  // weights of this half's and the other's rows
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float mo = r ? ml.y : ml.x, lo = r ? ml.w : ml.z, mx = fmaxf(m[r], mo);
      cm[r] = mx == -INFINITY ? 0.0f : exp2f((m[r] - mx) * a.scale_log2);
      co[r] = mx == -INFINITY ? 0.0f : exp2f((mo - mx) * a.scale_log2);
      l[r] = mix(l[r], cm[r], lo, co[r]);
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float4 v = __ldcg(other + j * kPThreads + tid);
      o[4 * j] = mix(o[4 * j], cm[0], v.x, co[0]);
      o[4 * j + 1] = mix(o[4 * j + 1], cm[0], v.y, co[0]);
      o[4 * j + 2] = mix(o[4 * j + 2], cm[1], v.z, co[1]);
      o[4 * j + 3] = mix(o[4 * j + 3], cm[1], v.w, co[1]);
    }
    if (tid == 0) a.counters[slot] = 0;  // both halves have arrived: zero for the next launch
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
void launch_prefill(const PrefillArgs& a, int items, int num_seqs, cudaStream_t st) {
  constexpr int smem = prefill_smem<kWG>();
  launch(mla_prefill_wgmma_kernel<kWG>, dim3(items * a.heads, num_seqs), kWG * 128, smem, st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace

namespace cuda {

PrefillSplit plan_prefill_split(const AttnMeta& m, int H, int sms, int max_counters) {
  constexpr int kPQ = kPrefillWG * 64;
  // Per sequence, its query blocks' key tiles (grow with the block: causal).
  std::vector<std::vector<int>> tiles(size_t(m.num_seqs));
  int64_t blocks = 0;
  std::vector<int> candidates;
  for (int s = 0; s < m.num_seqs; ++s) {
    const int qlen = m.h_query_start[s + 1] - m.h_query_start[s], ctx = m.h_context_len[s];
    for (int q0 = 0; q0 < qlen; q0 += kPQ) {
      tiles[size_t(s)].push_back(int(ceil_div(ctx + std::min(q0 + kPQ, qlen), kPK)));
      candidates.push_back(tiles[size_t(s)].back() - 1);
    }
    blocks += int64_t(tiles[size_t(s)].size()) * H;
  }
  // The kernel's order for a threshold: per sequence and head, whole blocks and split halves by size.
  auto order = [&](const std::vector<int>& t, int split_min, std::vector<int>& out) {
    out.clear();
    int first = int(t.size());
    while (first > 0 && t[size_t(first) - 1] > split_min) --first;
    for (int u = first - 1, v = int(t.size()) - 1; u >= 0 || v >= first;) {
      const int wu = u >= 0 ? t[size_t(u)] : -1, wv = v >= first ? (t[size_t(v)] + 1) / 2 : -1;
      if (wv >= wu) {  // halves: their tiles plus a merge of about one tile's cost
        out.push_back(t[size_t(v)] / 2 + 1);
        out.push_back(t[size_t(v)] - t[size_t(v)] / 2 + 1);
        --v;
      } else {
        out.push_back(t[size_t(u--)]);
      }
    }
    return int(t.size()) - first;
  };
  // Blocks start in launch order on the first free SM (one block per SM); each costs its tiles plus one
  // (Q and the pipeline's start).
  std::vector<int> seq_items;
  auto simulate = [&](int split_min, PrefillSplit& p) {
    std::priority_queue<int64_t, std::vector<int64_t>, std::greater<>> free_at;
    for (int i = 0; i < sms; ++i) free_at.push(0);
    int64_t end = 0;
    p = {0, split_min, 0};
    for (int s = 0; s < m.num_seqs; ++s) {
      p.max_split = std::max(p.max_split, order(tiles[size_t(s)], split_min, seq_items));
      p.items = std::max(p.items, int(seq_items.size()));
      for (int it : seq_items)
        for (int h = 0; h < H; ++h) {
          const int64_t t = free_at.top() + it + 1;
          free_at.pop();
          free_at.push(t);
          end = std::max(end, t);
        }
    }
    return end;
  };
  PrefillSplit best{};
  int64_t best_end = simulate(INT_MAX, best);
  // Splitting pays when few waves leave SMs idle behind the longest blocks; past 4 waves the tail is short.
  if (blocks > 4 * int64_t(sms)) return best;
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  for (int c : candidates) {
    if (c < 4) continue;  // a few tiles: the merge would cost as much as the split saves
    PrefillSplit p;
    const int64_t end = simulate(c, p);
    if (end < best_end && int64_t(m.num_seqs) * H * p.max_split <= max_counters) {
      best = p;
      best_end = end;
    }
  }
  return best;
}

int64_t prefill_part_floats(const PrefillSplit& p, int H, int num_seqs) {
  return int64_t(num_seqs) * H * p.max_split * 2 * 17 * kPrefillWG * 128 * 4;
}

void configure_mla_prefill_kernels() {
  allow_dynamic_smem(mla_prefill_wgmma_kernel<kPrefillWG>, prefill_smem<kPrefillWG>());
}

void run_mla_prefill_wgmma(const PrefillArgs& a, const PrefillSplit& split, int num_seqs, cudaStream_t st) {
  launch_prefill<kPrefillWG>(a, split.items, num_seqs, st);
}

}  // namespace cuda

}  // namespace beluga
