// MLA decode over the paged latent cache (absorbed form), tensor cores (mma.sync): a block per
// (token, 16 heads, key split) reads each 576-wide cache row once for all 16 heads ([latent 512 |
// rope 64], the first 512 are the values); a fixed split length, then a combine of the splits
// (flash-decoding style), either its own kernel or the prologue of the per-head W_UV product.
// Other shapes run the reference kernel (cuda_attention.cu). Tested against the CPU (tests/gpu).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/cuda_attention_ref.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_kernel_config.h"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

// MLA decode (absorbed), tensor cores. Heads are the M dimension (16 per block); 8 warps per block,
// a 64-key tile per round: each warp owns 8 keys of the scores and 64 of the 512 output columns.
// ncu (b=1, 1K context, 16 splits): with 4 warps and 32-key tiles each SM ran one warp per scheduler
// through ~3900 dependent instructions (15.6 us at base clocks, 2 % of issue slots busy), so the
// work per warp, not memory, set the time.
constexpr int kMDk = 576, kMDv = 512, kMHG = 16, kMTile = 64, kMWarps = 8, kMThreads = kMWarps * 32;
constexpr int kMLd = kMDk + 8, kMPLd = kMTile + 8, kMCols = kMDv / kMWarps;
// Shared memory of a block with kBufs key-tile buffers: 2 (175 KB, one block per SM) loads the next tile
// under this one's math; 1 (100 KB) lets two blocks share an SM, each one's loads under the other's
// math, for grids of several waves (large batches: ncu had the double-buffered kernel at ~2.2 TB/s of
// KV at b=256 1K and b=64 4K; bench/NOTES.md runs 118-119).
constexpr int mla_decode_smem(int bufs) {
  return (kMHG * kMLd + bufs * kMTile * kMLd) * 2 + kMHG * kMTile * 4 + kMHG * kMPLd * 2 + kMHG * 4;
}
// Splits per (token, head group) at most: the combine keeps one weight per split in shared memory.
constexpr int kMaxSplits = 128;
constexpr int kMinSplitKeys = 2 * kMTile;  // a split's keys at least, when split by length
static_assert(kMaxSplits % 32 == 0, "split_weights' lanes take kMaxSplits / 32 splits each");

struct DecodeArgs {
  const bf16* q;
  int64_t q0, q1;
  const bf16* cache;
  const int32_t* bt;
  int max_blocks, bs;
  const int32_t* qs;
  const int32_t* ctx;
  int S, H, split_len, num_splits;
  // Each token's split length from its own key count n: max(split_len, n / num_splits rounded up to the
  // tile), so a graph recorded for a bucket of keys splits each sequence by its real length; one tile
  // while n <= tile_splits tiles.
  bool by_length;
  int tile_splits;
  float scale_log2;
  float* o_part;   // [T, H, splits, 512]
  float* ml_part;  // [T, H, splits, 2]
  bf16* out;       // [T, H, 512] with strides o0, o1: written here when there is one split
  int64_t o0, o1;
};

// One split of one head group: keys [kb0, ke) of token t's sequence s, in mla_decode_smem(kBufs)
// bytes of shared memory.
template <int kBufs>
__device__ __forceinline__ void mla_decode_split(const DecodeArgs& a, unsigned char* smem_raw, int t, int h0,
                                                 int s, int kb0, int ke, int64_t part0) {
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + kMHG * kMLd;
  float* Ss = reinterpret_cast<float*>(Ks + kBufs * kMTile * kMLd);
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
    if constexpr (kBufs == 2) {
      if (tile + 1 < ntiles) load_tile((tile + 1) & 1, kt0 + kMTile);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      if (tile > 0) {  // the previous tile's readers are past the loop's last barrier
        load_tile(0, kt0);
        cp_async_commit();
      }
      cp_async_wait<0>();
    }
    __syncthreads();
    const bf16* kb = Ks + (kBufs == 2 ? tile & 1 : 0) * kMTile * kMLd;
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

template <int kBufs>
__global__ void __launch_bounds__(kMThreads) mla_decode_kernel(DecodeArgs a) {
  pdl_entry();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int split = blockIdx.x, h0 = blockIdx.y * kMHG, t = blockIdx.z, tid = threadIdx.x;
  const int s = seq_of_token(a.qs, a.S, t);
  const int n = a.ctx[s] + t - a.qs[s] + 1;
  const int len = !a.by_length ? a.split_len
                  : n <= a.tile_splits * kMTile
                      ? kMTile
                      : max(a.split_len, (n + a.num_splits * kMTile - 1) / (a.num_splits * kMTile) * kMTile);
  const int kb0 = split * len, ke = min(n, kb0 + len);
  const int64_t part0 = (int64_t(t) * a.H + h0) * a.num_splits + split;  // + hh * num_splits
  if (kb0 >= ke) {
    if (tid < kMHG) {
      a.ml_part[(part0 + int64_t(tid) * a.num_splits) * 2] = -INFINITY;
      a.ml_part[(part0 + int64_t(tid) * a.num_splits) * 2 + 1] = 0.0f;
    }
  } else {
    mla_decode_split<kBufs>(a, smem_raw, t, h0, s, kb0, ke, part0);
  }
}

// One (token, head)'s split weights in shared memory: w[i] = exp2(m_i - M) for split i (0 for splits
// without keys: past a short sequence's end, or beyond the ones its length needs), inv = 1 / sum_i
// w[i] * l_i, and the end of the splits with keys.
struct SplitWeights {
  float w[kMaxSplits];
  float inv;
  int end;
};

// Computed by one warp; lane i takes splits i, i + 32, ...
__device__ __forceinline__ void split_weights(const float* ml, int num_splits, SplitWeights* sw) {
  const int lane = threadIdx.x & 31;
  constexpr int kPer = kMaxSplits / 32;
  float m[kPer], l[kPer];
  bool live[kPer];
  float mx = -INFINITY;
  int end = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = lane + 32 * j;
    live[j] = i < num_splits && ml[2 * i + 1] > 0;
    m[j] = live[j] ? ml[2 * i] : -INFINITY;
    l[j] = live[j] ? ml[2 * i + 1] : 0.0f;
    mx = fmaxf(mx, m[j]);
    if (live[j]) end = i + 1;
  }
  end = __reduce_max_sync(0xffffffffu, end);
  const float M = warp_max(mx);
  float part = 0;  // splits without keys add exactly 0
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const float e = live[j] ? exp2f(m[j] - M) : 0.0f;
    part += e * l[j];
    sw->w[lane + 32 * j] = e;
  }
  const float den = warp_sum(part);
  if (lane == 0) {
    sw->inv = 1.0f / den;
    sw->end = end;
  }
}

// A float4 / float2 load the compiler issues where it is written (volatile), not where its value is
// first needed.
template <typename Vec>
__device__ __forceinline__ Vec load_early(const float* p) {
  Vec v;
  if constexpr (std::is_same_v<Vec, float4>)
    asm volatile("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
  else
    asm volatile("ld.global.nc.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}

// A lane's kCols adjacent columns d .. d + kCols of the merged row into dst (BF16): the partial outputs
// summed in split order, splits without keys skipped, then rescaled; four splits' partials are loaded
// before they are summed, up to the last split with keys. Both merges (the kernel below and the W_UV
// product's prologue) run this, so they give the same bits. Measured against the block-wide merge
// (bench/NOTES.md runs 132-134): b=1 -1.7 %, b=2 -3 to -5 %, b=4 -3 %, b=256 -1.1 to -1.6 %.
template <int kCols>
__device__ __forceinline__ void merge_columns(const float* op, const SplitWeights* sw, int d, bf16* dst) {
  static_assert(kCols == 2 || kCols == 4 || kCols == 8);
  constexpr int kVecF = kCols == 2 ? 2 : 4, kVecs = kCols / kVecF, kBatch = 4;
  using Vec = std::conditional_t<kVecF == 4, float4, float2>;
  float acc[kCols] = {};
  const int end = sw->end;  // splits past it have no keys
  for (int i0 = 0; i0 < end; i0 += kBatch) {
    // Loaded whether or not a split has keys (a dead split's partials are scratch, never summed) and
    // ahead of the sums: a load used only under a branch sank into it, one round trip per split.
    float e[kBatch];
    Vec v[kBatch][kVecs];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      e[j] = i0 + j < end ? sw->w[i0 + j] : 0.0f;
      const float* src = op + int64_t(min(i0 + j, end - 1)) * kMDv + d;
#pragma unroll
      for (int k = 0; k < kVecs; ++k) v[j][k] = load_early<Vec>(src + k * kVecF);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float* f = reinterpret_cast<const float*>(&v[j][0]);
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] = e[j] > 0 ? fmaf(e[j], f[c], acc[c]) : acc[c];
    }
  }
  const float inv = sw->inv;
  __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(dst + d);
#pragma unroll
  for (int c = 0; c < kCols / 2; ++c) p[c] = __floats2bfloat162_rn(acc[2 * c] * inv, acc[2 * c + 1] * inv);
}

// The merge as its own kernel (more than kGemvRows tokens): a warp per (token, head, quarter of the
// 512 columns), each lane 4 columns; the warp computes the row's split weights itself, so no block
// barrier stands between them and the columns. The block-per-row kernel before it (512 threads, a
// barrier) ran ~8 waves at b=256 1K: 20 us per layer for 17 MB (bench/NOTES.md run 131). Not the last
// split block: merging 16 heads in one block serialises ~3 L2 round trips per head (measured +36 us
// per layer at batch 1).
constexpr int kCombineWarps = 8, kCombineQuarters = 4;
__global__ void __launch_bounds__(kCombineWarps * 32)
    mla_combine_kernel(bf16* out, int64_t o0, int64_t o1, const float* o_part, const float* ml_part, int H,
                       int num_splits, int rows) {
  pdl_entry();
  __shared__ SplitWeights sw_all[kCombineWarps];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = blockIdx.x * kCombineWarps + warp, th = g / kCombineQuarters;
  if (th >= rows) return;
  SplitWeights* sw = &sw_all[warp];
  split_weights(ml_part + int64_t(th) * num_splits * 2, num_splits, sw);
  __syncwarp();
  merge_columns<4>(o_part + int64_t(th) * num_splits * kMDv, sw,
                   (g % kCombineQuarters) * (kMDv / kCombineQuarters) + 4 * lane,
                   out + (th / H) * o0 + (th % H) * o1);
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
  constexpr int kWarps = kGemvThreads / 32;
  static_assert(kWarps % kGemvRows == 0 && kGemvRows == 4);
  __shared__ __align__(16) bf16 xs[kGemvRows][kMDv];
  __shared__ SplitWeights sw_all[kWarps];
  pdl_entry();
  const int h = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // The T tokens' rows side by side: 8 / R warps per row (R = T rounded up to 1, 2 or 4), each computing
  // its row's split weights and merging 2R columns per lane.
  const int R = a.T == 1 ? 1 : a.T == 2 ? 2 : 4, per_row = kWarps / R, t = warp / per_row;
  if (t < a.T) {
    const int64_t th = int64_t(t) * a.H + h;
    SplitWeights* sw = &sw_all[warp];
    split_weights(a.ml_part + th * a.num_splits * 2, a.num_splits, sw);
    __syncwarp();
    const float* op = a.o_part + th * a.num_splits * kMDv;
    const int col = (warp % per_row) * 32 + lane;
    if (R == 1)
      merge_columns<2>(op, sw, col * 2, xs[t]);
    else if (R == 2)
      merge_columns<4>(op, sw, col * 4, xs[t]);
    else
      merge_columns<8>(op, sw, col * 8, xs[t]);
  }
  __syncthreads();
  gemv_block<bf16, 32, false>(a.out, a.o0, &xs[0][0], kMDv, a.w, a.w1, a.T, a.N, kMDv / 8,
                              HeadStrides{0, a.w0, a.o1}, blockIdx.x, h);
}

}  // namespace

void cuda::configure_mla_decode_kernels() {
  allow_dynamic_smem(mla_decode_kernel<2>, mla_decode_smem(2));
  allow_dynamic_smem(mla_decode_kernel<1>, mla_decode_smem(1));
}

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
  const bool fusable = !deterministic_ && T >= 1 && T <= kGemvRows && kv_rank == kMDv && w.ndim == 3 &&
                       w.shape[0] == H && w.shape[2] == kv_rank && w.stride[2] == 1 && w.stride[1] % 8 == 0 &&
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
    set_q_out(a, q, out);
    set_paged(a, cache, m);
    a.entry = Dk;
    reference_attention(a, m, H, Dk, kv_rank, scale);
    return false;
  }
  // Split the keys so that the grid covers the GPU about twice, in at most kMaxSplits splits of at
  // least mla_min_split_ keys (multiples of the 64-key tile): each split writes 16 heads x 512 F32
  // partial outputs that the combine reads back, 32 KB against 64 x 1152 B of cache read. Measured
  // (V2-Lite, H200, b=1, graphs, 32-key tiles then): minimum 256 keys -> 4 splits at 1K: 3.08 ms per
  // step; 64 -> 16 splits: 2.50 ms; 32: 2.58 ms; at 4K, 32 splits of 128 keys 2.93 ms against 16 of
  // 256 3.21 ms and 64 of 64 3.06 ms. With 64-key tiles (bench/NOTES.md run 39): 2.22 / 2.46 ms.
  // More than 32 splits (up to 128) only while every split still has an SM to itself (the kernel's
  // shared memory allows one block per SM), that is at batch 1-2 here; then each token's keys are split
  // by its own length (the kernel divides them over the splits, at least kMinSplitKeys each), since a
  // graph's key count is its bucket's, up to twice the real one. Measured at b=1 (bench/NOTES.md runs
  // 103-107, ms per step): 32 splits sized for the bucket 2.40 at 4K and 3.51 at 16K; 64 splits 2.30 /
  // 2.86; by length 2.30 / 2.68 (b=2 16K 4.65 -> 4.45), at 1K 2.18 -> 2.20; 64-key minimum pieces lost at
  // 4K (2.47). At b=4, 64 splits made two waves of blocks: 4K 5.63 -> 5.78.
  // From batch 3, the splits that cover the GPU about twice, each token's keys divided over them by its
  // own length too (the bucket's split length left up to half of a graph's blocks without keys):
  // b=64 1K 10.53 -> 10.39 ms, b=256 1K 14.65 -> 14.20, 4K 22.26 -> 21.98, b=16 / b=64 at 4K +0.4-0.5 %
  // (bench/NOTES.md run 120). BELUGA_MLA_BY_LENGTH=0 keeps the bucket's split length there.
  const int64_t blocks = int64_t(T) * (H / kMHG);
  int64_t max_splits = kMaxSplits;
  if (deterministic_) {
    // Pieces of det_split_len_ keys from each token's first key, at least two splits so that every
    // token takes the merge (a single split normalises in the decode kernel, in another order): a
    // token's pieces and their merge depend on its own key count alone.
    max_splits = std::max<int64_t>(2, ceil_div(nk, det_split_len_));
    BELUGA_CHECK(max_splits <= kMaxSplits, "MLA decode: ", nk, " keys exceed the deterministic split limit (",
                 int64_t(kMaxSplits) * det_split_len_, ")");
  } else {
    while (max_splits > 32 && blocks * max_splits > sm_count_) max_splits /= 2;
  }
  int split_len, splits;
  int tile_splits = 0;
  bool by_length = max_splits > 32 || mla_by_length_;
  if (deterministic_) {
    split_len = det_split_len_;
    splits = int(max_splits);
    by_length = false;
  } else if (max_splits > 32) {
    split_len = kMinSplitKeys;
    // Up to mla_tile_splits_ splits of one tile each for short sequences: a block's work is a latency
    // chain (ncu: ~1300 dependent instructions per warp for two tiles, 0.2 eligible warps per
    // scheduler), and one tile is about half of it. b=1 1K 2.21 -> 2.16 ms (decode 9.4 -> 6.9 us per
    // layer, combine + W_UV 5.1 -> 5.9); 4K keeps 32 splits of 128 keys, as 64 one-tile splits there
    // were no faster (bench/NOTES.md run 127).
    tile_splits = int(std::min<int64_t>(mla_tile_splits_, max_splits));
    splits = int(std::min<int64_t>(
        max_splits, std::max(ceil_div(nk, split_len), std::min<int64_t>(tile_splits, ceil_div(nk, kMTile)))));
  } else {
    const int64_t want = std::clamp<int64_t>(ceil_div(2 * sm_count_, blocks), 1, max_splits);
    // By length: `want` splits (fewer for short contexts), each token's keys divided on the device.
    split_len = by_length
                    ? mla_min_split_
                    : int(std::max<int64_t>(mla_min_split_, ceil_div(ceil_div(nk, want), kMTile) * kMTile));
    splits = int(by_length ? std::min<int64_t>(want, ceil_div(nk, split_len)) : ceil_div(nk, split_len));
  }
  Tensor o_part = scratch(DType::kF32, {int64_t(T) * H * splits, kMDv});
  Tensor ml = scratch(DType::kF32, {int64_t(T) * H * splits, 2});
  DecodeArgs a{};
  set_q_out(a, q, out);
  set_paged(a, cache, m);
  a.H = H;
  a.split_len = split_len;
  a.num_splits = splits;
  a.by_length = by_length;
  a.tile_splits = tile_splits;
  a.scale_log2 = scale * kLog2e;
  a.o_part = o_part.ptr<float>();
  a.ml_part = ml.ptr<float>();
  // Two single-buffered blocks per SM once the grid is more than two waves of one block per SM. Measured
  // (V2-Lite, graphs, ms per step, 2 rounds; bench/NOTES.md run 118): b=64 1K 10.43 -> 10.33, 4K 13.84 ->
  // 13.30, b=256 1K 14.84 -> 14.50, 4K 23.25 -> 22.12; b=16 4K (256 blocks, half of them without keys)
  // loses with it, 8.64 -> 9.03, and keeps two buffers.
  const bool one_buf =
      !deterministic_ &&
      (mla_decode_bufs_ == 1 || (mla_decode_bufs_ == 0 && blocks * splits > 2 * int64_t(sm_count_)));
  const dim3 grid(splits, H / kMHG, T);
  if (one_buf)
    launch(mla_decode_kernel<1>, grid, kMThreads, mla_decode_smem(1), S(stream_), a);
  else
    launch(mla_decode_kernel<2>, grid, kMThreads, mla_decode_smem(2), S(stream_), a);
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
    launch(mla_combine_kernel, int(ceil_div(int64_t(T) * H * kCombineQuarters, kCombineWarps)),
           kCombineWarps * 32, 0, S(stream_), out.ptr<bf16>(), out.stride[0], out.stride[1],
           o_part.ptr<float>(), ml.ptr<float>(), H, splits, T * H);
    BELUGA_LAUNCH_CHECK();
  }
  return false;
}

void CudaOps::set_deterministic_keys(int64_t max_keys) {
  det_split_len_ =
      int(std::max<int64_t>(4 * kMTile, ceil_div(ceil_div(max_keys, kMaxSplits), kMTile) * kMTile));
}

}  // namespace beluga
