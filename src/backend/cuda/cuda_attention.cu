// Attention over the paged KV cache on the GPU (writing and gathering cache rows: cuda_kv_cache.cu).
// Fast paths (tensor cores, mma.sync):
//  - MLA decode, absorbed: [576-wide latent rows | 512 of them are the values], a block per
//    (token, 16 heads, key split); all 16 heads share each cache row read; a fixed split length
//    and a combine kernel (split-KV, flash-decoding style).
//  - MLA prefill, expanded (q/k 192 = nope 128 + rope 64, v 128): flash-attention 2 style, a block
//    per (64 queries, head, sequence), causal over cached prefix + new chunk, variable length.
// Any other shape (and GQA) runs the reference kernel: a block per (token, head), scores in a
// global workspace, F32 throughout. Both are tested against the CPU backend (tests/gpu).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ---------------------------------------------------------------------------------------------
// Reference attention: any head dims; mode 0 MLA absorbed, 1 MLA expanded, 2 GQA.
struct RefArgs {
  int mode;
  const bf16* q;
  int64_t q0, q1;
  bf16* out;
  int64_t o0, o1;
  const bf16* cache;
  int entry;
  const int32_t* bt;
  int max_blocks, bs;
  const bf16* kv;
  int64_t kv0, kv1;
  const bf16* kpe;
  int64_t kpe0;
  int nope;
  int kv_heads, group;
  const int32_t* qs;
  const int32_t* ctx;
  int S, H, Dk, Dv;
  float scale;
  float* scores;
  int64_t max_keys;
};

struct RefRow {
  const bf16* k;  // pointer to key element 0 (mode 1: k_nope; the rope part at kpe)
  const bf16* kpe;
  const bf16* v;
};

__device__ __forceinline__ RefRow ref_row(const RefArgs& a, int s, int64_t base, int h, int j) {
  RefRow r{};
  if (a.mode == 1) {
    const bf16* row = a.kv + (base + j) * a.kv0 + h * a.kv1;
    r.k = row;
    r.kpe = a.kpe + (base + j) * a.kpe0;
    r.v = row + a.nope;
  } else {
    const bf16* row =
        a.cache + (int64_t(a.bt[int64_t(s) * a.max_blocks + j / a.bs]) * a.bs + j % a.bs) * a.entry;
    if (a.mode == 0) {
      r.k = row;
      r.v = row;
    } else {
      const int kvh = h / a.group;
      r.k = row + int64_t(kvh) * a.Dk;
      r.v = row + int64_t(a.kv_heads + kvh) * a.Dk;
    }
  }
  return r;
}

__device__ __forceinline__ float ref_k(const RefArgs& a, const RefRow& r, int d) {
  if (a.mode == 1 && d >= a.nope) return to_f(r.kpe[d - a.nope]);
  return to_f(r.k[d]);
}

__global__ void ref_attention_kernel(RefArgs a) {
  pdl_entry();
  extern __shared__ float qsm[];
  __shared__ float red[33];
  const int h = blockIdx.x, t = blockIdx.y;
  const int s = seq_of_token(a.qs, a.S, t);
  const int n = a.ctx[s] + t - a.qs[s] + 1;
  int64_t base = a.qs[s];
  if (a.mode == 1)
    for (int i = 0; i < s; ++i) base += a.ctx[i];
  for (int d = threadIdx.x; d < a.Dk; d += blockDim.x) qsm[d] = to_f(a.q[t * a.q0 + h * a.q1 + d]);
  __syncthreads();
  float* sc = a.scores + (int64_t(t) * a.H + h) * a.max_keys;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  float mx = -INFINITY;
  for (int j = w; j < n; j += nw) {
    const RefRow r = ref_row(a, s, base, h, j);
    float dot = 0;
    for (int d = lane; d < a.Dk; d += 32) dot += qsm[d] * ref_k(a, r, d);
    dot = warp_sum(dot) * a.scale;
    if (lane == 0) sc[j] = dot;
    mx = fmaxf(mx, dot);
  }
  mx = block_max(mx, red);
  float sum = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float p = __expf(sc[j] - mx);
    sc[j] = p;
    sum += p;
  }
  sum = block_sum(sum, red);  // its barriers also order the writes to sc before the reads below
  const float inv = 1.0f / sum;
  for (int d = threadIdx.x; d < a.Dv; d += blockDim.x) {
    float acc = 0;
    for (int j = 0; j < n; ++j) {
      const RefRow r = ref_row(a, s, base, h, j);
      acc += sc[j] * to_f(r.v[d]);
    }
    a.out[t * a.o0 + h * a.o1 + d] = __float2bfloat16(acc * inv);
  }
}

// ---------------------------------------------------------------------------------------------
// MLA decode (absorbed), tensor cores. Heads are the M dimension (16 per block); 8 warps per block,
// a 64-key tile per round: each warp owns 8 keys of the scores and 64 of the 512 output columns.
// ncu (b=1, 1K context, 16 splits): with 4 warps and 32-key tiles each SM ran one warp per scheduler
// through ~3900 dependent instructions (15.6 us at base clocks, 2 % of issue slots busy), so the
// work per warp, not memory, set the time.
constexpr int kMDk = 576, kMDv = 512, kMHG = 16, kMTile = 64, kMWarps = 8, kMThreads = kMWarps * 32;
constexpr int kMLd = kMDk + 8, kMPLd = kMTile + 8, kMCols = kMDv / kMWarps;
constexpr int kMSmem =
    (kMHG * kMLd + 2 * kMTile * kMLd) * 2 + kMHG * kMTile * 4 + kMHG * kMPLd * 2 + kMHG * 4;
// Splits per (token, head group) at most: the combine keeps one weight per split in shared memory.
constexpr int kMaxSplits = 32;

struct DecodeArgs {
  const bf16* q;
  int64_t q0, q1;
  const bf16* cache;
  const int32_t* bt;
  int max_blocks, bs;
  const int32_t* qs;
  const int32_t* ctx;
  int S, H, split_len, num_splits;
  float scale_log2;
  float* o_part;   // [T, H, splits, 512]
  float* ml_part;  // [T, H, splits, 2]
  bf16* out;       // [T, H, 512] with strides o0, o1: written here when there is one split
  int64_t o0, o1;
};

// One split of one head group: keys [kb0, ke) of token t's sequence s.
__device__ __forceinline__ void mla_decode_split(const DecodeArgs& a, unsigned char* smem_raw, int t, int h0,
                                                 int s, int kb0, int ke, int64_t part0) {
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kMHG * kMLd;
  float* Ss = reinterpret_cast<float*>(Ks + 2 * kMTile * kMLd);
  bf16* Ps = reinterpret_cast<bf16*>(Ss + kMHG * kMTile);
  float* alpha_s = reinterpret_cast<float*>(Ps + kMHG * kMPLd);
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  for (int c = tid; c < kMHG * (kMDk / 8); c += kMThreads) {
    const int hh = c / (kMDk / 8), part = c % (kMDk / 8);
    cp_async16(Qs + hh * kMLd + part * 8, a.q + t * a.q0 + (h0 + hh) * a.q1 + part * 8, true);
  }
  const int32_t* bt = a.bt + int64_t(s) * a.max_blocks;
  // Four threads per key: one block-table lookup each per tile, then 18 16-byte chunks of the row
  // (the four together cover 64 contiguous bytes per step).
  constexpr int kTpk = kMThreads / kMTile, kChunks = kMDk / 8;
  const int lkey = tid / kTpk, lsub = tid % kTpk;
  auto load_tile = [&](int buf, int kt0) {
    bf16* kb = Ks + buf * kMTile * kMLd + lkey * kMLd;
    const int j = kt0 + lkey;
    const bool ok = j < ke;
    const bf16* row = ok ? a.cache + (int64_t(bt[j / a.bs]) * a.bs + j % a.bs) * kMDk : a.cache;
#pragma unroll
    for (int part = lsub; part < kChunks; part += kTpk) cp_async16(kb + part * 8, row + part * 8, ok);
  };
  const int ntiles = (ke - kb0 + kMTile - 1) / kMTile;
  load_tile(0, kb0);
  cp_async_commit();

  float o[kMCols / 8][4];
#pragma unroll
  for (int j = 0; j < kMCols / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  // Softmax state of head (tid / 16), replicated over its 16 threads.
  constexpr int kTph = kMThreads / kMHG, kKpt = kMTile / kTph;
  float m_run = -INFINITY, l_run = 0.0f;

  for (int tile = 0; tile < ntiles; ++tile) {
    const int kt0 = kb0 + tile * kMTile;
    if (tile + 1 < ntiles) load_tile((tile + 1) & 1, kt0 + kMTile);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* kb = Ks + (tile & 1) * kMTile * kMLd;
    // S[16 heads, 64 keys]: warp w takes keys 8w..8w+7; two accumulators halve the mma chain.
    float sacc[2][4] = {};
#pragma unroll 6
    for (int kk = 0; kk < kMDk / 16; ++kk) {
      uint32_t af[4], bfr[2];
      ldsm_x4(af, Qs + (lane & 15) * kMLd + kk * 16 + (lane >> 4) * 8);
      ldsm_x2(bfr, kb + (w * 8 + (lane & 7)) * kMLd + kk * 16 + ((lane >> 3) & 1) * 8);
      mma_bf16(sacc[kk & 1], af, bfr[0], bfr[1]);
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int key = w * 8 + 2 * t4 + (q & 1), hh = g + (q >> 1) * 8;
      Ss[hh * kMTile + key] = (kt0 + key < ke) ? (sacc[0][q] + sacc[1][q]) * a.scale_log2 : -INFINITY;
    }
    __syncthreads();
    {
      const int hh = tid / kTph, sub = tid % kTph;
      float v[kKpt], tmax = -INFINITY;
#pragma unroll
      for (int i = 0; i < kKpt; ++i) tmax = fmaxf(tmax, v[i] = Ss[hh * kMTile + sub * kKpt + i]);
#pragma unroll
      for (int off = 1; off < kTph; off <<= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float m_new = fmaxf(m_run, tmax);
      const float alpha = exp2f(m_run - m_new);
      float psum = 0;
#pragma unroll
      for (int i = 0; i < kKpt; ++i) {
        const float p = exp2f(v[i] - m_new);
        psum += p;
        Ps[hh * kMPLd + sub * kKpt + i] = __float2bfloat16(p);
      }
#pragma unroll
      for (int off = 1; off < kTph; off <<= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
      l_run = l_run * alpha + psum;
      m_run = m_new;
      if (sub == 0) alpha_s[hh] = alpha;
    }
    __syncthreads();
    const float al0 = alpha_s[g], al1 = alpha_s[g + 8];
#pragma unroll
    for (int j = 0; j < kMCols / 8; ++j) {
      o[j][0] *= al0;
      o[j][1] *= al0;
      o[j][2] *= al1;
      o[j][3] *= al1;
    }
    // O[16 heads, 64 columns of warp w] += P[16, 64 keys] . V[64 keys, those columns].
#pragma unroll
    for (int kk = 0; kk < kMTile / 16; ++kk) {
      uint32_t pf[4];
      ldsm_x4(pf, Ps + (lane & 15) * kMPLd + kk * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int jp = 0; jp < kMCols / 16; ++jp) {
        uint32_t vb[4];
        ldsm_x4_t(vb, kb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kMLd + w * kMCols + jp * 16 +
                          (lane >> 4) * 8);
        mma_bf16(o[2 * jp], pf, vb[0], vb[1]);
        mma_bf16(o[2 * jp + 1], pf, vb[2], vb[3]);
      }
    }
    __syncthreads();
  }
  cp_async_wait<0>();
  if (a.num_splits == 1) {  // nothing to merge: normalise and write the output
    if (tid % kTph == 0) alpha_s[tid / kTph] = 1.0f / l_run;
    __syncthreads();
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int hh = g + half * 8;
      const float inv = alpha_s[hh];
      bf16* op = a.out + t * a.o0 + (h0 + hh) * a.o1 + w * kMCols + 2 * t4;
#pragma unroll
      for (int j = 0; j < kMCols / 8; ++j)
        *reinterpret_cast<__nv_bfloat162*>(op + j * 8) =
            __floats2bfloat162_rn(o[j][half * 2] * inv, o[j][half * 2 + 1] * inv);
    }
    return;
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float* op = a.o_part + (part0 + int64_t(g + half * 8) * a.num_splits) * kMDv + w * kMCols + 2 * t4;
#pragma unroll
    for (int j = 0; j < kMCols / 8; ++j)
      *reinterpret_cast<float2*>(op + j * 8) = make_float2(o[j][half * 2], o[j][half * 2 + 1]);
  }
  if (tid % kTph == 0) {
    const int hh = tid / kTph;
    a.ml_part[(part0 + int64_t(hh) * a.num_splits) * 2] = m_run;
    a.ml_part[(part0 + int64_t(hh) * a.num_splits) * 2 + 1] = l_run;
  }
}

__global__ void __launch_bounds__(kMThreads) mla_decode_kernel(DecodeArgs a) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int split = blockIdx.x, h0 = blockIdx.y * kMHG, t = blockIdx.z, tid = threadIdx.x;
  const int s = seq_of_token(a.qs, a.S, t);
  const int n = a.ctx[s] + t - a.qs[s] + 1;
  const int kb0 = split * a.split_len, ke = min(n, kb0 + a.split_len);
  const int64_t part0 = (int64_t(t) * a.H + h0) * a.num_splits + split;  // + hh * num_splits
  if (kb0 >= ke) {
    if (tid < kMHG) {
      a.ml_part[(part0 + int64_t(tid) * a.num_splits) * 2] = -INFINITY;
      a.ml_part[(part0 + int64_t(tid) * a.num_splits) * 2 + 1] = 0.0f;
    }
  } else {
    mla_decode_split(a, smem_raw, t, h0, s, kb0, ke, part0);
  }
}

// One (token, head)'s output: the sum over splits of the partial outputs, each rescaled to the common
// maximum, into dst[0 .. kMDv) (BF16); the block's threads split the columns. Shared by the combine
// kernel and the W_UV product that combines in its prologue, so both give the same bits. The first
// warp turns the (max, sum) pairs into one weight per split in shared memory (wsm, kMaxSplits + 1
// floats), so each column's loads are independent of each other (a loop over the pairs per thread
// was a chain of L2 round trips: 8.2 us per layer with the W_UV product at batch 1).
__device__ __forceinline__ void combine_splits(const float* ml, const float* op, int num_splits, bf16* dst,
                                               float* wsm) {
  __syncthreads();  // wsm may still be read for the previous row
  if (threadIdx.x < 32) {
    const int i = threadIdx.x;
    // Splits past a short sequence's keys have no keys (sum 0); they come after the others.
    const bool live = i < num_splits && ml[2 * i + 1] > 0;
    const float m = live ? ml[2 * i] : -INFINITY, l = live ? ml[2 * i + 1] : 0.0f;
    const float M = warp_max(m);
    const float e = live ? exp2f(m - M) : 0.0f;
    const float den = warp_sum(e * l);
    wsm[i] = e;
    if (i == 0) wsm[kMaxSplits] = 1.0f / den;
  }
  __syncthreads();
  const float inv = wsm[kMaxSplits];
  for (int d = threadIdx.x; d < kMDv; d += blockDim.x) {
    float acc = 0;
#pragma unroll 8
    for (int i = 0; i < num_splits; ++i) {
      const float e = wsm[i];
      if (e > 0) acc += e * op[int64_t(i) * kMDv + d];
    }
    dst[d] = __float2bfloat16(acc * inv);
  }
}

// A separate kernel, not the last split block: merging 16 heads in one block serialises ~3 L2 round
// trips per head (measured +36 us per layer at batch 1), while here a block per (token, head) runs in
// parallel.
__global__ void mla_combine_kernel(bf16* out, int64_t o0, int64_t o1, const float* o_part,
                                   const float* ml_part, int H, int num_splits) {
  pdl_entry();
  __shared__ float wsm[kMaxSplits + 1];
  const int th = blockIdx.x, t = th / H, h = th % H;
  combine_splits(ml_part + int64_t(th) * num_splits * 2, o_part + int64_t(th) * num_splits * kMDv, num_splits,
                 out + t * o0 + h * o1, wsm);
}

// The absorbed output's W_UV product per head with the split combine in its prologue: block (x, h)
// merges head h's splits of the T <= kGemvRows tokens into shared memory, then runs gemv_block on
// them (in place of mla_combine_kernel + linear_heads: one launch fewer, the same bits).
struct UvArgs {
  const float* o_part;
  const float* ml_part;
  int H, num_splits, T;
  bf16* out;  // [T, H, v]
  int64_t o0, o1;
  const bf16* w;  // [H, v, kMDv]
  int64_t w0, w1;
  int N;  // v
};

__global__ void __launch_bounds__(kGemvThreads) mla_combine_uv_kernel(UvArgs a) {
  __shared__ __align__(16) bf16 xs[kGemvRows][kMDv];
  __shared__ float wsm[kMaxSplits + 1];
  pdl_entry();
  const int h = blockIdx.y;
  for (int t = 0; t < a.T; ++t) {
    const int64_t th = int64_t(t) * a.H + h;
    combine_splits(a.ml_part + th * a.num_splits * 2, a.o_part + th * a.num_splits * kMDv, a.num_splits,
                   xs[t], wsm);
  }
  __syncthreads();
  gemv_block<bf16, 32, false>(a.out, a.o0, &xs[0][0], kMDv, a.w, a.w1, a.T, a.N, kMDv / 8,
                              HeadStrides{0, a.w0, a.o1}, blockIdx.x, h);
}

// ---------------------------------------------------------------------------------------------
// MLA prefill (expanded), flash-attention 2 with mma.sync. 4 warps x 16 query rows.
constexpr int kEQ = 64, kEK = 64, kEDk = 192, kENope = 128, kEDv = 128, kELdK = kEDk + 8, kELdV = kEDv + 8;
constexpr int kESmem = (kEQ * kELdK + 2 * kEK * kELdK + 2 * kEK * kELdV) * 2;

struct PrefillArgs {
  const bf16* q;
  int64_t q0, q1;
  const bf16* kv;
  int64_t kv0, kv1;
  const bf16* kpe;
  int64_t kpe0;
  bf16* out;
  int64_t o0, o1;
  const int32_t* qs;
  const int32_t* ctx;
  float scale_log2;
};

__global__ void __launch_bounds__(128) mla_prefill_kernel(PrefillArgs a) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kEQ * kELdK;
  bf16* Vs = Ks + 2 * kEK * kELdK;
  // Causal: later query blocks see more keys, so they go first and the short ones fill the tail.
  const int s = blockIdx.z, h = blockIdx.y, q0 = (gridDim.x - 1 - blockIdx.x) * kEQ;
  const int qlen = a.qs[s + 1] - a.qs[s];
  if (q0 >= qlen) return;
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t4 = lane & 3;
  const int ctx = a.ctx[s];
  int64_t base = a.qs[s];
  for (int i = 0; i < s; ++i) base += a.ctx[i];
  const int nkeys = ctx + min(q0 + kEQ, qlen);
  const int64_t qrow0 = a.qs[s] + q0;
  for (int c = tid; c < kEQ * (kEDk / 8); c += 128) {
    const int r = c / (kEDk / 8), part = c % (kEDk / 8);
    const bool ok = q0 + r < qlen;
    cp_async16(Qs + r * kELdK + part * 8, ok ? a.q + (qrow0 + r) * a.q0 + h * a.q1 + part * 8 : a.q, ok);
  }
  auto load_tile = [&](int buf, int kt0) {
    bf16* kb = Ks + buf * kEK * kELdK;
    bf16* vb = Vs + buf * kEK * kELdV;
    for (int c = tid; c < kEK * (kEDk / 8); c += 128) {
      const int key = c / (kEDk / 8), part = c % (kEDk / 8), j = kt0 + key;
      const bool ok = j < nkeys;
      const bf16* src = a.kv;
      if (ok)
        src = part < kENope / 8 ? a.kv + (base + j) * a.kv0 + h * a.kv1 + part * 8
                                : a.kpe + (base + j) * a.kpe0 + (part - kENope / 8) * 8;
      cp_async16(kb + key * kELdK + part * 8, src, ok);
    }
    for (int c = tid; c < kEK * (kEDv / 8); c += 128) {
      const int key = c / (kEDv / 8), part = c % (kEDv / 8), j = kt0 + key;
      const bool ok = j < nkeys;
      cp_async16(vb + key * kELdV + part * 8,
                 ok ? a.kv + (base + j) * a.kv0 + h * a.kv1 + kENope + part * 8 : a.kv, ok);
    }
  };
  load_tile(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  uint32_t qf[kEDk / 16][4];
#pragma unroll
  for (int kk = 0; kk < kEDk / 16; ++kk)
    ldsm_x4(qf[kk], Qs + (w * 16 + (lane & 15)) * kELdK + kk * 16 + (lane >> 4) * 8);

  const int qi0 = q0 + w * 16 + g, qi1 = qi0 + 8;  // query rows of this thread (index within the chunk)
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float o[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  const int ntiles = (nkeys + kEK - 1) / kEK;
  for (int tile = 0; tile < ntiles; ++tile) {
    const int kt0 = tile * kEK;
    if (tile + 1 < ntiles) load_tile((tile + 1) & 1, kt0 + kEK);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const bf16* kb = Ks + (tile & 1) * kEK * kELdK;
    const bf16* vb = Vs + (tile & 1) * kEK * kELdV;
    float sacc[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kEDk / 16; ++kk)
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        uint32_t b[4];
        ldsm_x4(b, kb + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kELdK + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16(sacc[2 * np], qf[kk], b[0], b[1]);
        mma_bf16(sacc[2 * np + 1], qf[kk], b[2], b[3]);
      }
    float rm[2] = {-INFINITY, -INFINITY};
    // Only tiles that reach past the warp's first row (the diagonal) or past the keys need the mask.
    const bool full = kt0 + kEK <= nkeys && kt0 + kEK - 1 <= ctx + q0 + w * 16;
    if (full) {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          sacc[nt][q] *= a.scale_log2;
          rm[q >> 1] = fmaxf(rm[q >> 1], sacc[nt][q]);
        }
    } else {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int j = kt0 + nt * 8 + 2 * t4 + (q & 1);
          const int qi = q < 2 ? qi0 : qi1;
          const bool ok = j < nkeys && j <= ctx + qi;
          sacc[nt][q] = ok ? sacc[nt][q] * a.scale_log2 : -INFINITY;
          rm[q >> 1] = fmaxf(rm[q >> 1], sacc[nt][q]);
        }
    }
    float alpha[2], mu[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      rm[r] = fmaxf(rm[r], __shfl_xor_sync(0xffffffffu, rm[r], 1));
      rm[r] = fmaxf(rm[r], __shfl_xor_sync(0xffffffffu, rm[r], 2));
      const float m_new = fmaxf(m[r], rm[r]);
      mu[r] = m_new == -INFINITY ? 0.0f : m_new;
      alpha[r] = exp2f(m[r] - mu[r]);
      m[r] = m_new;
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      o[j][0] *= alpha[0];
      o[j][1] *= alpha[0];
      o[j][2] *= alpha[1];
      o[j][3] *= alpha[1];
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float p = exp2f(sacc[nt][q] - mu[q >> 1]);
        sacc[nt][q] = p;
        l[q >> 1] += p;
      }
#pragma unroll
    for (int kk = 0; kk < kEK / 16; ++kk) {
      uint32_t pa[4];
      pa[0] = pack_bf16(sacc[2 * kk][0], sacc[2 * kk][1]);
      pa[1] = pack_bf16(sacc[2 * kk][2], sacc[2 * kk][3]);
      pa[2] = pack_bf16(sacc[2 * kk + 1][0], sacc[2 * kk + 1][1]);
      pa[3] = pack_bf16(sacc[2 * kk + 1][2], sacc[2 * kk + 1][3]);
#pragma unroll
      for (int jp = 0; jp < 8; ++jp) {
        uint32_t v[4];
        ldsm_x4_t(v, vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kELdV + jp * 16 + (lane >> 4) * 8);
        mma_bf16(o[2 * jp], pa, v[0], v[1]);
        mma_bf16(o[2 * jp + 1], pa, v[2], v[3]);
      }
    }
    __syncthreads();
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
          __floats2bfloat162_rn(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
  }
}

void run_reference(RefArgs a, int T, int max_keys_, Tensor scores, cudaStream_t st) {
  a.scores = scores.ptr<float>();
  a.max_keys = max_keys_;
  launch(ref_attention_kernel, dim3(a.H, T), 128, size_t(a.Dk) * sizeof(float), st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace

void CudaOps::mla_attention_absorbed(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                                     int kv_rank, float scale) {
  Prof prof_scope(this, "mla_attention_absorbed");
  mla_decode(out, q, cache, m, kv_rank, scale, nullptr, Tensor{});
}

void CudaOps::mla_attention_absorbed_uv(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m,
                                        int kv_rank, float scale, const Tensor& w_uv) {
  const int64_t T = m.num_tokens, H = q.shape[1];
  const Tensor& w = bf16_weight(w_uv, Tensor{}, 128, 128);
  // The fused combine + W_UV needs the GEMV's conditions (few tokens, 16-byte rows) and kMDv columns.
  const bool fusable = T >= 1 && T <= kGemvRows && kv_rank == kMDv && w.ndim == 3 && w.shape[0] == H &&
                       w.shape[2] == kv_rank && w.stride[2] == 1 && w.stride[1] % 8 == 0 &&
                       w.stride[0] % 8 == 0 && aligned16(w.data) && out.dtype == DType::kBF16 &&
                       out.ndim == 3 && out.shape[0] == T && out.shape[1] == H &&
                       out.shape[2] == w.shape[1] && out.stride[2] == 1;
  if (!fusable) {
    Ops::mla_attention_absorbed_uv(out, q, cache, m, kv_rank, scale, w_uv);
    return;
  }
  Prof prof_scope(this, "mla_attention_absorbed_uv");
  // The latent output, used when there is a single split (the decode kernel writes it) or none of
  // the fast path: then W_UV runs as its own product.
  Tensor olat = scratch(DType::kBF16, {T, H, kv_rank});
  if (!mla_decode(olat, q, cache, m, kv_rank, scale, &w, out)) linear_heads(out, olat, w);
}

bool CudaOps::mla_decode(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_rank,
                         float scale, const Tensor* w_uv, Tensor uv_out) {
  check_cache(cache);
  const int T = m.num_tokens, H = int(q.shape[1]), Dk = int(q.shape[2]);
  BELUGA_CHECK(q.dtype == DType::kBF16 && out.dtype == DType::kBF16 && Dk == cache.shape[2] &&
                   out.shape[2] == kv_rank && q.stride[2] == 1 && out.stride[2] == 1,
               "mla_attention_absorbed: shapes ", q.describe(), " ", cache.describe(), " ", out.describe());
  if (T == 0) return false;
  const int nk = max_keys(m);
  const bool fast = !reference_attention_ && Dk == kMDk && kv_rank == kMDv && H % kMHG == 0 &&
                    q.stride[1] % 8 == 0 && q.stride[0] % 8 == 0 && aligned16(q.data) &&
                    aligned16(cache.data) && out.stride[0] % 2 == 0 && out.stride[1] % 2 == 0 &&
                    (reinterpret_cast<uintptr_t>(out.data) & 3) == 0;
  if (!fast) {
    RefArgs a{};
    a.mode = 0;
    a.q = q.ptr<const bf16>();
    a.q0 = q.stride[0];
    a.q1 = q.stride[1];
    a.out = out.ptr<bf16>();
    a.o0 = out.stride[0];
    a.o1 = out.stride[1];
    a.cache = cache.ptr<const bf16>();
    a.entry = Dk;
    a.bt = m.block_table;
    a.max_blocks = m.max_blocks;
    a.bs = m.block_size;
    a.qs = m.query_start;
    a.ctx = m.context_len;
    a.S = m.num_seqs;
    a.H = H;
    a.Dk = Dk;
    a.Dv = kv_rank;
    a.scale = scale;
    run_reference(a, T, nk, scratch(DType::kF32, {int64_t(T) * H, nk}), S(stream_));
    return false;
  }
  // Split the keys so that the grid covers the GPU about twice, in at most kMaxSplits splits of at
  // least mla_min_split_ keys (multiples of the 64-key tile): each split writes 16 heads x 512 F32
  // partial outputs that the combine reads back, 32 KB against 64 x 1152 B of cache read. Measured
  // (V2-Lite, H200, b=1, graphs, 32-key tiles then): minimum 256 keys -> 4 splits at 1K: 3.08 ms per
  // step; 64 -> 16 splits: 2.50 ms; 32: 2.58 ms; at 4K, 32 splits of 128 keys 2.93 ms against 16 of
  // 256 3.21 ms and 64 of 64 3.06 ms. With 64-key tiles (bench/NOTES.md run 39): 2.22 / 2.46 ms.
  const int64_t blocks = int64_t(T) * (H / kMHG);
  const int64_t want = std::clamp<int64_t>(ceil_div(2 * sm_count_, blocks), 1, kMaxSplits);
  const int split_len = int(std::max<int64_t>(mla_min_split_, ceil_div(ceil_div(nk, want), kMTile) * kMTile));
  const int splits = int(ceil_div(nk, split_len));
  Tensor o_part = scratch(DType::kF32, {int64_t(T) * H * splits, kMDv});
  Tensor ml = scratch(DType::kF32, {int64_t(T) * H * splits, 2});
  static bool configured = false;
  if (!configured) {
    BELUGA_CUDA_CHECK(
        cudaFuncSetAttribute(mla_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMSmem));
    configured = true;
  }
  DecodeArgs a{};
  a.q = q.ptr<const bf16>();
  a.q0 = q.stride[0];
  a.q1 = q.stride[1];
  a.cache = cache.ptr<const bf16>();
  a.bt = m.block_table;
  a.max_blocks = m.max_blocks;
  a.bs = m.block_size;
  a.qs = m.query_start;
  a.ctx = m.context_len;
  a.S = m.num_seqs;
  a.H = H;
  a.split_len = split_len;
  a.num_splits = splits;
  a.scale_log2 = scale * kLog2e;
  a.o_part = o_part.ptr<float>();
  a.ml_part = ml.ptr<float>();
  a.out = out.ptr<bf16>();
  a.o0 = out.stride[0];
  a.o1 = out.stride[1];
  launch(mla_decode_kernel, dim3(splits, H / kMHG, T), kMThreads, kMSmem, S(stream_), a);
  BELUGA_LAUNCH_CHECK();
  if (splits > 1 && w_uv) {  // the combine runs in the W_UV product's prologue
    const Tensor& w = *w_uv;
    UvArgs u{o_part.ptr<float>(),
             ml.ptr<float>(),
             H,
             splits,
             T,
             uv_out.ptr<bf16>(),
             uv_out.stride[0],
             uv_out.stride[1],
             w.ptr<const bf16>(),
             w.stride[0],
             w.stride[1],
             int(w.shape[1])};
    launch(mla_combine_uv_kernel, dim3(unsigned(ceil_div(int64_t(u.N) * 32, kGemvThreads)), unsigned(H)),
           kGemvThreads, 0, S(stream_), u);
    BELUGA_LAUNCH_CHECK();
    return true;
  }
  if (splits > 1) {
    launch(mla_combine_kernel, T * H, kMDv, 0, S(stream_), out.ptr<bf16>(), out.stride[0], out.stride[1],
           o_part.ptr<float>(), ml.ptr<float>(), H, splits);
    BELUGA_LAUNCH_CHECK();
  }
  return false;
}

void CudaOps::mla_attention_expanded(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& k_pe,
                                     const AttnMeta& m, float scale) {
  Prof prof_scope(this, "mla_attention_expanded");
  const int T = m.num_tokens, H = int(q.shape[1]), Dqk = int(q.shape[2]), Dv = int(out.shape[2]);
  const int Dr = int(k_pe.shape[1]), Dn = Dqk - Dr;
  BELUGA_CHECK(q.dtype == DType::kBF16 && kv.dtype == DType::kBF16 && k_pe.dtype == DType::kBF16 &&
                   kv.shape[1] == H && kv.shape[2] == Dn + Dv && q.stride[2] == 1 && kv.stride[2] == 1 &&
                   k_pe.stride[1] == 1 && out.stride[2] == 1,
               "mla_attention_expanded: shapes");
  if (T == 0) return;
  const bool fast = !reference_attention_ && Dqk == kEDk && Dn == kENope && Dv == kEDv &&
                    q.stride[0] % 8 == 0 && q.stride[1] % 8 == 0 && kv.stride[0] % 8 == 0 &&
                    kv.stride[1] % 8 == 0 && k_pe.stride[0] % 8 == 0 && aligned16(q.data) &&
                    aligned16(kv.data) && aligned16(k_pe.data) && out.stride[1] % 2 == 0 &&
                    out.stride[0] % 2 == 0;
  if (!fast) {
    RefArgs a{};
    a.mode = 1;
    a.q = q.ptr<const bf16>();
    a.q0 = q.stride[0];
    a.q1 = q.stride[1];
    a.out = out.ptr<bf16>();
    a.o0 = out.stride[0];
    a.o1 = out.stride[1];
    a.kv = kv.ptr<const bf16>();
    a.kv0 = kv.stride[0];
    a.kv1 = kv.stride[1];
    a.kpe = k_pe.ptr<const bf16>();
    a.kpe0 = k_pe.stride[0];
    a.nope = Dn;
    a.qs = m.query_start;
    a.ctx = m.context_len;
    a.S = m.num_seqs;
    a.H = H;
    a.Dk = Dqk;
    a.Dv = Dv;
    a.scale = scale;
    const int nk = max_keys(m);
    run_reference(a, T, nk, scratch(DType::kF32, {int64_t(T) * H, nk}), S(stream_));
    return;
  }
  int max_q = 1;
  for (int s = 0; s < m.num_seqs; ++s) max_q = std::max(max_q, m.h_query_start[s + 1] - m.h_query_start[s]);
  static bool configured = false;
  if (!configured) {
    BELUGA_CUDA_CHECK(
        cudaFuncSetAttribute(mla_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kESmem));
    configured = true;
  }
  PrefillArgs a{};
  a.q = q.ptr<const bf16>();
  a.q0 = q.stride[0];
  a.q1 = q.stride[1];
  a.kv = kv.ptr<const bf16>();
  a.kv0 = kv.stride[0];
  a.kv1 = kv.stride[1];
  a.kpe = k_pe.ptr<const bf16>();
  a.kpe0 = k_pe.stride[0];
  a.out = out.ptr<bf16>();
  a.o0 = out.stride[0];
  a.o1 = out.stride[1];
  a.qs = m.query_start;
  a.ctx = m.context_len;
  a.scale_log2 = scale * kLog2e;
  launch(mla_prefill_kernel, dim3(int(ceil_div(max_q, kEQ)), H, m.num_seqs), 128, kESmem, S(stream_), a);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::gqa_attention(Tensor out, const Tensor& q, const Tensor& cache, const AttnMeta& m, int kv_heads,
                            float scale) {
  Prof prof_scope(this, "gqa_attention");
  check_cache(cache);
  const int T = m.num_tokens, H = int(q.shape[1]), D = int(q.shape[2]);
  BELUGA_CHECK(q.dtype == DType::kBF16 && cache.shape[2] == 2 * kv_heads * D && H % kv_heads == 0 &&
                   q.stride[2] == 1 && out.stride[2] == 1,
               "gqa_attention: shapes");
  if (T == 0) return;
  RefArgs a{};
  a.mode = 2;
  a.q = q.ptr<const bf16>();
  a.q0 = q.stride[0];
  a.q1 = q.stride[1];
  a.out = out.ptr<bf16>();
  a.o0 = out.stride[0];
  a.o1 = out.stride[1];
  a.cache = cache.ptr<const bf16>();
  a.entry = int(cache.shape[2]);
  a.bt = m.block_table;
  a.max_blocks = m.max_blocks;
  a.bs = m.block_size;
  a.kv_heads = kv_heads;
  a.group = H / kv_heads;
  a.qs = m.query_start;
  a.ctx = m.context_len;
  a.S = m.num_seqs;
  a.H = H;
  a.Dk = D;
  a.Dv = D;
  a.scale = scale;
  const int nk = max_keys(m);
  run_reference(a, T, nk, scratch(DType::kF32, {int64_t(T) * H, nk}), S(stream_));
}

}  // namespace beluga
