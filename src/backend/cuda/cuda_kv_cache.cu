// The paged KV cache on the GPU: writing token rows (plain, or MLA's fused prologue: normed latent,
// rotated k_pe, rotated q_pe) and gathering a sequence's rows for the expanded attention.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemv.cuh"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

__global__ void cache_write_kernel(bf16* cache, int D, const bf16* e, int64_t lde, const int32_t* slots,
                                   int T) {
  pdl_entry();
  const int64_t n = int64_t(T) * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / D, d = i % D;
    if (slots[t] >= 0) cache[int64_t(slots[t]) * D + d] = e[t * lde + d];  // < 0: a padding row
  }
}

struct PrepareArgs {
  bf16* cache;
  int entry;
  const bf16* kva;
  int64_t ldk;
  int r;
  VecRef w;
  float eps;
  bf16* qpe;
  int64_t q0, q1;
  int H;
  bf16* qout;  // null: q_pe stays in place only
  int64_t o0, o1;
  const int32_t* pos;
  const int32_t* slots;
  const float* cos_t;
  const float* sin_t;
  int half;
  bool interleaved, vec_rows;
};

// Token t's part of MLA's prologue, one block (kNormThreads) per token (see Ops::mla_prepare). The
// arithmetic is that of rmsnorm_kernel (its sum order: `vec_rows` as it decides) and rope_kernel (F32
// from BF16 inputs, one rounding per output).
__device__ __forceinline__ void mla_prepare_block(const PrepareArgs& a, int t) {
  __shared__ float red[33];
  const bf16* kr = a.kva + int64_t(t) * a.ldk;
  const float inv = rsqrtf(block_row_sumsq(kr, a.r, a.vec_rows, red) / float(a.r) + a.eps);
  const int slot = a.slots[t], p = a.pos[t], half = a.half;
  const float* ct = a.cos_t + int64_t(p) * half;
  const float* st = a.sin_t + int64_t(p) * half;
  auto rotate = [&](const bf16* src, bf16* dst, bf16* dst2, int k) {
    const int ia = a.interleaved ? 2 * k : k, ib = a.interleaved ? 2 * k + 1 : k + half;
    const float x0 = to_f(src[ia]), x1 = to_f(src[ib]);
    const bf16 u = __float2bfloat16(x0 * ct[k] - x1 * st[k]), v = __float2bfloat16(x1 * ct[k] + x0 * st[k]);
    dst[ia] = u;
    dst[ib] = v;
    if (dst2) {
      dst2[ia] = u;
      dst2[ib] = v;
    }
  };
  if (slot >= 0) {  // < 0: a padding row, nothing cached
    bf16* crow = a.cache + int64_t(slot) * a.entry;
    for (int d = threadIdx.x; d < a.r; d += blockDim.x)
      crow[d] = __float2bfloat16(a.w[d] * (to_f(kr[d]) * inv));
    for (int k = threadIdx.x; k < half; k += blockDim.x) rotate(kr + a.r, crow + a.r, nullptr, k);
  }
  for (int i = threadIdx.x; i < a.H * half; i += blockDim.x) {
    const int h = i / half, k = i % half;
    bf16* v = a.qpe + int64_t(t) * a.q0 + int64_t(h) * a.q1;
    rotate(v, v, a.qout ? a.qout + int64_t(t) * a.o0 + int64_t(h) * a.o1 : nullptr, k);
  }
}

__global__ void __launch_bounds__(kNormThreads) mla_prepare_kernel(PrepareArgs a) {
  pdl_entry();
  mla_prepare_block(a, blockIdx.x);
}

// The absorbed query's latent part (W_UK per head, gemv_block) beside the prologue in one launch:
// the two are independent (disjoint columns of q and q_lat), and decode pays more per launch than
// for either's work. Blocks [0, gx * H) run the product, the T after them the prologue.
struct UkArgs {
  bf16* out;
  int64_t ldo;
  const bf16* x;
  int64_t ldx;
  const bf16* w;
  int64_t ldw;
  int M, N, K8, gx;
  HeadStrides hs;
};

template <int kLanes>
__global__ void __launch_bounds__(kNormThreads) mla_prepare_uk_kernel(PrepareArgs a, UkArgs g) {
  static_assert(kNormThreads == kGemvThreads);
  pdl_entry();
  const int b = blockIdx.x, nb = g.gx * a.H;
  if (b < nb)
    gemv_block<bf16, kLanes>(g.out, g.ldo, g.x, g.ldx, g.w, g.ldw, g.M, g.N, g.K8, g.hs, b % g.gx, b / g.gx);
  else
    mla_prepare_block(a, b - nb);
}

// Grid (row chunks, sequence): each sequence's context rows (cached + new), after those of the
// sequences before it; 16-byte copies (D % 8 == 0 and aligned rows, checked by the caller).
__global__ void gather_context_kernel(uint4* out, int64_t ldo16, const uint4* cache, int D16,
                                      const int32_t* qs, const int32_t* ctx, const int32_t* bt,
                                      int max_blocks, int bs) {
  pdl_entry();
  const int s = blockIdx.y;
  int64_t base = qs[s];
  for (int i = 0; i < s; ++i) base += ctx[i];
  const int n = ctx[s] + qs[s + 1] - qs[s];
  const int64_t total = int64_t(n) * D16;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int j = int(i / D16), d = int(i % D16);
    const int64_t row = int64_t(bt[int64_t(s) * max_blocks + j / bs]) * bs + j % bs;
    out[(base + j) * ldo16 + d] = cache[row * D16 + d];
  }
}

}  // namespace

void CudaOps::cache_write(Tensor cache, const Tensor& entries, const AttnMeta& m) {
  Prof prof_scope(this, "cache_write");
  check_cache(cache);
  const int D = int(cache.shape[2]);
  BELUGA_CHECK(entries.dtype == DType::kBF16 && entries.shape[1] == D && entries.stride[1] == 1,
               "cache_write: entries ", entries.describe(), " for a cache of width ", D);
  if (m.num_tokens == 0) return;
  const int64_t n = int64_t(m.num_tokens) * D;
  launch(cache_write_kernel, int(std::min<int64_t>(ceil_div(n, 256), 65536)), 256, 0, S(stream_),
         cache.ptr<bf16>(), D, entries.ptr<const bf16>(), entries.stride[0], m.slot_mapping, m.num_tokens);
  BELUGA_LAUNCH_CHECK();
}

namespace {

PrepareArgs prepare_args(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps, Tensor q_pe,
                         Tensor q_pe_out, const Tensor& positions, const RopeTable& rope, const AttnMeta& m) {
  check_cache(cache);
  const int T = int(kva.shape[0]), width = int(kva.shape[1]), r = width - rope.rotary_dim;
  const int H = int(q_pe.shape[1]), half = rope.rotary_dim / 2;
  BELUGA_CHECK(kva.dtype == DType::kBF16 && kva.stride[1] == 1 && cache.shape[2] == width && r > 0 &&
                   norm_w.numel() == r && q_pe.dtype == DType::kBF16 && q_pe.ndim == 3 &&
                   q_pe.stride[2] == 1 && q_pe.shape[0] == T && q_pe.shape[2] == rope.rotary_dim &&
                   (q_pe_out.empty() ||
                    (q_pe_out.dtype == DType::kBF16 && q_pe_out.ndim == 3 && q_pe_out.stride[2] == 1 &&
                     q_pe_out.shape[1] == H && q_pe_out.shape[2] == rope.rotary_dim)),
               "mla_prepare: shapes ", kva.describe(), " ", q_pe.describe(), " ", cache.describe());
  const bool out = !q_pe_out.empty();
  return PrepareArgs{cache.ptr<bf16>(),
                     width,
                     kva.ptr<const bf16>(),
                     kva.stride[0],
                     r,
                     vec(norm_w),
                     eps,
                     q_pe.ptr<bf16>(),
                     q_pe.stride[0],
                     q_pe.stride[1],
                     H,
                     out ? q_pe_out.ptr<bf16>() : nullptr,
                     out ? q_pe_out.stride[0] : 0,
                     out ? q_pe_out.stride[1] : 0,
                     positions.ptr<const int32_t>(),
                     m.slot_mapping,
                     rope.cos.ptr<const float>(),
                     rope.sin.ptr<const float>(),
                     half,
                     rope.interleaved,
                     r % 8 == 0 && kva.stride[0] % 8 == 0 && aligned16(kva.data) && aligned16(norm_w.data)};
}

}  // namespace

void CudaOps::mla_prepare(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps, Tensor q_pe,
                          Tensor q_pe_out, const Tensor& positions, const RopeTable& rope,
                          const AttnMeta& m) {
  Prof prof_scope(this, "mla_prepare");
  const PrepareArgs a = prepare_args(cache, kva, norm_w, eps, q_pe, q_pe_out, positions, rope, m);
  const int T = int(kva.shape[0]);
  if (T == 0) return;
  launch(mla_prepare_kernel, T, kNormThreads, 0, S(stream_), a);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::mla_prepare_absorbed(Tensor cache, const Tensor& kva, const Tensor& norm_w, float eps,
                                   Tensor q_pe, Tensor q_pe_out, const Tensor& positions,
                                   const RopeTable& rope, const AttnMeta& m, Tensor q_lat,
                                   const Tensor& q_nope, const Tensor& w_uk_t) {
  const int64_t T = q_nope.shape[0], H = q_nope.shape[1], K = q_nope.shape[2], N = w_uk_t.shape[1];
  const Tensor& w = bf16_weight(w_uk_t, Tensor{}, 128, 128);
  // Where linear_heads would take its GEMV; else the two ops one after the other.
  const bool fused = !deterministic_ && T >= 1 && w_uk_t.ndim == 3 && w_uk_t.shape[0] == H &&
                     w_uk_t.shape[2] == K && q_lat.dtype == DType::kBF16 && q_lat.ndim == 3 &&
                     q_lat.shape[2] == N && q_lat.stride[2] == 1 && q_nope.dtype == DType::kBF16 &&
                     q_nope.stride[2] == 1 && w.stride[2] == 1 && heads_gemv_ok(q_nope, w);
  if (!fused) {
    Ops::mla_prepare_absorbed(cache, kva, norm_w, eps, q_pe, q_pe_out, positions, rope, m, q_lat, q_nope,
                              w_uk_t);
    return;
  }
  Prof prof_scope(this, "mla_prepare_absorbed");
  const PrepareArgs a = prepare_args(cache, kva, norm_w, eps, q_pe, q_pe_out, positions, rope, m);
  const int K8 = int(K / 8), lanes = gemv_lanes(K8);
  UkArgs g{q_lat.ptr<bf16>(),
           q_lat.stride[0],
           q_nope.ptr<const bf16>(),
           q_nope.stride[0],
           w.ptr<const bf16>(),
           w.stride[1],
           int(T),
           int(N),
           K8,
           int(ceil_div(N * lanes, kGemvThreads)),
           HeadStrides{q_nope.stride[1], w.stride[0], q_lat.stride[1]}};
  const int grid = int(g.gx * H + T);
  if (lanes == 8)
    launch(mla_prepare_uk_kernel<8>, grid, kNormThreads, 0, S(stream_), a, g);
  else if (lanes == 16)
    launch(mla_prepare_uk_kernel<16>, grid, kNormThreads, 0, S(stream_), a, g);
  else
    launch(mla_prepare_uk_kernel<32>, grid, kNormThreads, 0, S(stream_), a, g);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::gather_context(Tensor out, const Tensor& cache, const AttnMeta& m) {
  Prof prof_scope(this, "gather_context");
  check_cache(cache);
  BELUGA_CHECK(out.dtype == DType::kBF16 && out.stride[1] == 1 && out.shape[1] == cache.shape[2],
               "gather_context: output ", out.describe());
  if (m.num_seqs == 0) return;
  const int D = int(cache.shape[2]);
  BELUGA_CHECK(D % 8 == 0 && out.stride[0] % 8 == 0 && aligned16(out.data) && aligned16(cache.data),
               "gather_context: rows must be 16-byte aligned");
  const int64_t chunks = int64_t(max_keys(m)) * (D / 8);
  const int gx = int(std::min<int64_t>(ceil_div(chunks, 256), 4096));
  launch(gather_context_kernel, dim3(gx, m.num_seqs), 256, 0, S(stream_), static_cast<uint4*>(out.data),
         out.stride[0] / 8, static_cast<const uint4*>(cache.data), D / 8, m.query_start, m.context_len,
         m.block_table, m.max_blocks, m.block_size);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
