// Attention over the paged KV cache on the GPU (writing and gathering cache rows: cuda_kv_cache.cu;
// the absorbed MLA decode: cuda_mla_decode.cu).
// Fast path (tensor cores, mma.sync): MLA prefill, expanded (q/k 192 = nope 128 + rope 64, v 128):
// flash-attention 2 style, a block per (64 queries, head, sequence), causal over cached prefix + new
// chunk, variable length.
// Any other shape (and GQA) runs the reference kernel: a block per (token, head), scores in a
// global workspace, F32 throughout. Both are tested against the CPU backend (tests/gpu).
#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_attention_ref.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

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

}  // namespace

namespace cuda {

void run_reference(RefArgs a, int T, int max_keys_, Tensor scores, cudaStream_t st) {
  a.scores = scores.ptr<float>();
  a.max_keys = max_keys_;
  launch(ref_attention_kernel, dim3(a.H, T), 128, size_t(a.Dk) * sizeof(float), st, a);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace cuda

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
