// DeepSeek-V4's shared-KV attention with sinks on the GPU (ops.h: v4_sink_attention), over the paged
// cache. A block per (query row, group of HG heads): the group's queries in shared memory, then the
// row's keys (its window's token rows, then its compressed entries: every complete one or the
// indexer's picks, read through the block table) in tiles of 32 rows. Per tile a lane per row
// computes the logits (with fewer than 4 heads, each head's columns split over several warps), a
// running softmax per head that starts from the head's sink (a logit with no value: m = sink, l = 1)
// rescales the accumulators, and each thread adds p * row over its own columns (K = V: the tile in
// shared memory serves both products). Fewer heads per block when the batch is small, so the grid
// covers the GPU.
#include "backend/cuda/cuda_kernel_config.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_v4_paged.cuh"

namespace beluga {

using namespace cuda;

namespace {

constexpr int kSinkThreads = 128;  // 4 warps
constexpr int kSinkTile = 32;      // rows per tile: a lane per row in the logit phase
constexpr int kSinkMaxCols = 4;    // output columns per thread: D <= 512
constexpr int kSinkMaxD = kSinkThreads * kSinkMaxCols;

struct SinkArgs {
  bf16* out;
  int64_t ldo_t, ldo_h;
  const bf16* q;
  int64_t ldq_t, ldq_h;
  const bf16* kv;  // token rows, D columns
  int64_t ldkv;
  const bf16* comp;  // entry rows, D columns (null: a sliding layer)
  int64_t ldc;
  const int32_t* ids;  // [T, K] picks (null: every complete entry)
  int64_t ldi;
  const float* sinks;
  int D, K, window, rate, per_block;
  float scale;
  V4Step step;
};

template <int HG>
constexpr int kParts = HG >= 4 ? 1 : 4 / HG;  // warps per head in the logit phase

template <int HG>
size_t sink_smem(int D) {
  return size_t(kSinkTile) * size_t(D + 8) * sizeof(bf16) +
         (size_t(HG) * D + size_t(HG) * kParts<HG> * kSinkTile) * sizeof(float);
}

template <int HG>
__global__ void __launch_bounds__(kSinkThreads) v4_sink_attention_kernel(SinkArgs a) {
  pdl_entry();
  constexpr int P = kParts<HG>, HW = HG >= 4 ? HG / 4 : 1;  // HW: heads per warp in the logit phase
  extern __shared__ __align__(16) unsigned char raw[];
  __shared__ const bf16* rows[kSinkTile];
  __shared__ float m_s[HG], l_s[HG], alpha_s[HG];
  const int ld = a.D + 8;  // padded rows: 16-byte reads of 8 lanes (8 rows) hit distinct banks
  bf16* kv_s = reinterpret_cast<bf16*>(raw);                     // [kSinkTile][ld]
  float* q_s = reinterpret_cast<float*>(kv_s + kSinkTile * ld);  // [HG][D], pre-scaled
  float* part = q_s + HG * a.D;                                  // [HG][P][kSinkTile]; then p
  const int t = blockIdx.x, h0 = blockIdx.y * HG, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const V4Row r = v4_row(a.step, t);
  const int j0 = max(0, r.pos - a.window + 1), nwin = r.pos - j0 + 1;
  const int n = nwin + (!a.comp ? 0 : a.ids ? a.K : (r.pos + 1) / a.rate);
  for (int i = threadIdx.x; i < HG * a.D; i += blockDim.x)
    q_s[i] = to_f(a.q[int64_t(t) * a.ldq_t + int64_t(h0 + i / a.D) * a.ldq_h + i % a.D]) * a.scale;
  if (threadIdx.x < HG) {
    m_s[threadIdx.x] = a.sinks[h0 + threadIdx.x];
    l_s[threadIdx.x] = 1.0f;
  }
  float acc[HG][kSinkMaxCols] = {};
  const int d8 = a.D / 8;
  // The logit phase's share: heads g0 .. g0 + HW - 1, columns [c_lo, c_hi) in pieces of 8.
  const int g0 = HG >= 4 ? warp * HW : warp / P, pi = HG >= 4 ? 0 : warp % P;
  const int c_lo = pi * d8 / P, c_hi = (pi + 1) * d8 / P;
  for (int base = 0; base < n; base += kSinkTile) {
    __syncthreads();  // the last tile is read (and, the first time, q_s and the state are written)
    if (threadIdx.x < kSinkTile) {
      const int i = base + threadIdx.x;
      const bf16* row = nullptr;
      if (i < nwin) {
        row = a.kv + v4_token_row(r.table, j0 + i) * a.ldkv;
      } else if (i < n) {
        const int e = a.ids ? a.ids[int64_t(t) * a.ldi + (i - nwin)] : i - nwin;
        if (e >= 0) row = a.comp + v4_entry_row(r.table, e, a.rate, a.per_block) * a.ldc;
      }
      rows[threadIdx.x] = row;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < kSinkTile * d8; i += blockDim.x) {
      const int j = i / d8, c8 = i % d8;
      const bf16* row = rows[j];
      reinterpret_cast<uint4*>(kv_s + j * ld)[c8] = row ? reinterpret_cast<const uint4*>(row)[c8] : uint4{};
    }
    __syncthreads();
    if (g0 < HG) {
      float dot[HW] = {};
      const uint4* kj = reinterpret_cast<const uint4*>(kv_s + lane * ld);
      for (int c8 = c_lo; c8 < c_hi; ++c8) {
        float kf[8];
        unpack8(kj[c8], kf);
#pragma unroll
        for (int hh = 0; hh < HW; ++hh) dot[hh] += dot8(q_s + (g0 + hh) * a.D + c8 * 8, kf);
      }
#pragma unroll
      for (int hh = 0; hh < HW; ++hh) part[((g0 + hh) * P + pi) * kSinkTile + lane] = dot[hh];
    }
    __syncthreads();
    // The running softmax, a warp per head; p replaces the head's first logit part.
    for (int g = warp; g < HG; g += kSinkThreads / 32) {
      float s = 0;
#pragma unroll
      for (int pp = 0; pp < P; ++pp) s += part[(g * P + pp) * kSinkTile + lane];
      const bool valid = base + lane < n && rows[lane] != nullptr;
      s = valid ? s : -INFINITY;
      const float m_old = m_s[g], m_new = fmaxf(m_old, warp_max(s));
      const float pe = valid ? __expf(s - m_new) : 0.0f;
      const float sum = warp_sum(pe);
      part[g * P * kSinkTile + lane] = pe;
      if (lane == 0) {
        const float al = __expf(m_old - m_new);
        alpha_s[g] = al;
        l_s[g] = l_s[g] * al + sum;
        m_s[g] = m_new;
      }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < HG; ++g) {
      const float al = alpha_s[g];
#pragma unroll
      for (int k = 0; k < kSinkMaxCols; ++k) acc[g][k] *= al;
    }
    const int here = min(kSinkTile, n - base);
    for (int j = 0; j < here; ++j) {
      float v[kSinkMaxCols];
#pragma unroll
      for (int k = 0; k < kSinkMaxCols; ++k) {
        const int c = threadIdx.x + k * kSinkThreads;
        v[k] = c < a.D ? to_f(kv_s[j * ld + c]) : 0.0f;
      }
#pragma unroll
      for (int g = 0; g < HG; ++g) {
        const float pj = part[g * P * kSinkTile + j];
#pragma unroll
        for (int k = 0; k < kSinkMaxCols; ++k) acc[g][k] += pj * v[k];
      }
    }
  }
#pragma unroll
  for (int g = 0; g < HG; ++g) {
    const float inv = 1.0f / l_s[g];
    bf16* o = a.out + int64_t(t) * a.ldo_t + int64_t(h0 + g) * a.ldo_h;
#pragma unroll
    for (int k = 0; k < kSinkMaxCols; ++k) {
      const int c = threadIdx.x + k * kSinkThreads;
      if (c < a.D) o[c] = __float2bfloat16(acc[g][k] * inv);
    }
  }
}

template <int HG>
void launch_sink(const SinkArgs& a, int T, int H, cudaStream_t st) {
  launch(v4_sink_attention_kernel<HG>, dim3(unsigned(T), unsigned(H / HG)), kSinkThreads, sink_smem<HG>(a.D),
         st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace

void cuda::configure_v4_attention_kernels() {
  allow_dynamic_smem(v4_sink_attention_kernel<8>, int(sink_smem<8>(kSinkMaxD)));
  allow_dynamic_smem(v4_sink_attention_kernel<4>, int(sink_smem<4>(kSinkMaxD)));
  allow_dynamic_smem(v4_sink_attention_kernel<2>, int(sink_smem<2>(kSinkMaxD)));
  allow_dynamic_smem(v4_sink_attention_kernel<1>, int(sink_smem<1>(kSinkMaxD)));
}

void CudaOps::v4_sink_attention(Tensor out, const Tensor& q, const Tensor& kv, const Tensor& comp,
                                int per_block, const Tensor& comp_ids, const Tensor& sinks, int window,
                                int rate, float scale, const AttnMeta& m) {
  Prof prof_scope(this, "v4_sink_attention");
  const int64_t T = m.num_tokens, H = q.shape[1], D = q.shape[2];
  check_bf16_rows(kv, "v4_sink_attention window rows");
  if (!comp.empty()) check_bf16_rows(comp, "v4_sink_attention entries");
  BELUGA_CHECK(q.dtype == DType::kBF16 && q.ndim == 3 && q.stride[2] == 1 && q.shape[0] == T &&
                   out.dtype == DType::kBF16 && out.ndim == 3 && out.stride[2] == 1 && out.shape[0] == T &&
                   out.shape[1] == H && out.shape[2] == D && kv.shape[1] == D && D % 8 == 0 &&
                   D <= kSinkMaxD && aligned16(kv.data) && kv.stride[0] % 8 == 0 &&
                   (comp.empty() || (comp.shape[1] == D && aligned16(comp.data) && comp.stride[0] % 8 == 0 &&
                                     rate > 0 && per_block > 0)) &&
                   (comp_ids.empty() ||
                    (comp_ids.dtype == DType::kI32 && comp_ids.stride[1] == 1 && comp_ids.shape[0] == T)) &&
                   sinks.dtype == DType::kF32 && sinks.numel() == H && window > 0 && m.block_size == 64,
               "v4_sink_attention: shapes ", q.describe(), " ", kv.describe(), " ", comp.describe(), " -> ",
               out.describe());
  if (T == 0) return;
  const SinkArgs a{out.ptr<bf16>(),
                   out.stride[0],
                   out.stride[1],
                   q.ptr<const bf16>(),
                   q.stride[0],
                   q.stride[1],
                   kv.ptr<const bf16>(),
                   kv.stride[0],
                   comp.empty() ? nullptr : comp.ptr<const bf16>(),
                   comp.empty() ? 0 : comp.stride[0],
                   comp.empty() || comp_ids.empty() ? nullptr : comp_ids.ptr<const int32_t>(),
                   comp_ids.empty() ? 0 : comp_ids.stride[0],
                   sinks.ptr<const float>(),
                   int(D),
                   comp_ids.empty() ? 0 : int(comp_ids.shape[1]),
                   window,
                   rate,
                   per_block,
                   scale,
                   v4_step(m)};
  // Heads per block: as many as still give two blocks per SM (a decode batch of one row gets a block
  // per head).
  auto fits = [&](int hg) { return H % hg == 0 && T * (H / hg) >= 2 * int64_t(sm_count_); };
  cudaStream_t st = S(stream_);
  if (fits(8))
    launch_sink<8>(a, int(T), int(H), st);
  else if (fits(4))
    launch_sink<4>(a, int(T), int(H), st);
  else if (fits(2))
    launch_sink<2>(a, int(T), int(H), st);
  else
    launch_sink<1>(a, int(T), int(H), st);
}

}  // namespace beluga
