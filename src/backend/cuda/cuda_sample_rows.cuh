// The device sampler's kernel (backend/sample_rows.h has the contract): one 1024-thread block per
// logit row, every pass a grid-stride read of the row (L2-resident at decode batches). A prefix of
// the descending order (top_k, top_p, the draw) is found without sorting: a radix select over the
// logits' order-preserving 32-bit keys (digits of 11, 11 and 10 bits, weights summed per bin in shared
// memory), then the boundary key's ties in id order. Weights are counts (top_k) or 2^-40 fixed-point
// probabilities, summed with integer atomics: the result does not depend on the order of the adds,
// so a row's token is a function of its logits and parameters alone.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/sample_rows.h"

namespace beluga::cuda::sampling {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
using u64 = unsigned long long;

struct Shared {
  // A bin's 64-bit weight as two words: 32-bit shared atomics are native (64-bit adds would spin on a
  // compare-and-swap), and integer adds keep the sum independent of their order.
  uint32_t hist_lo[2048], hist_hi[2048];
  u64 warp[kWarps];
  float fw[kWarps], fw2[kWarps];
  int iw[kWarps];
  u64 value;
  float fvalue;
  int ivalue, tie_count, tie_min;
  int top_n;
  int top_id[kMaxTopLogprobs];
  float top_lp[kMaxTopLogprobs];
};

// Larger float -> larger key; -inf is below every finite value.
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ void add_bin(Shared& sh, uint32_t b, u64 w) {
  const uint32_t lo = uint32_t(w), old = atomicAdd(&sh.hist_lo[b], lo);
  const uint32_t hi = uint32_t(w >> 32) + (old + lo < old ? 1u : 0u);  // the low word's carry
  if (hi) atomicAdd(&sh.hist_hi[b], hi);
}

__device__ __forceinline__ u64 bin(const Shared& sh, int b) {
  return (u64(sh.hist_hi[b]) << 32) + sh.hist_lo[b];
}

// A probability in [0, 1] as 2^-40 fixed point (2^40 * p is exact in float: a power of two).
__device__ __forceinline__ u64 fixed(float p) {
  return u64(p * 1099511627776.0f);
}

__device__ __forceinline__ u64 block_sum(u64 v, Shared& sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (lane == 0) sh.warp[w] = v;
  __syncthreads();
  if (w == 0) {
    v = sh.warp[lane];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) sh.value = v;
  }
  __syncthreads();
  v = sh.value;
  __syncthreads();
  return v;
}

// Inclusive prefix sum over the block's threads in thread order; *total: the block's sum.
__device__ __forceinline__ u64 block_scan(u64 v, Shared& sh, u64* total) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const u64 n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  if (lane == 31) sh.warp[w] = v;
  __syncthreads();
  if (w == 0) {
    u64 t = sh.warp[lane];
    for (int o = 1; o < 32; o <<= 1) {
      const u64 n = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += n;
    }
    sh.warp[lane] = t;
  }
  __syncthreads();
  const u64 pre = w > 0 ? sh.warp[w - 1] : 0;
  *total = sh.warp[kWarps - 1];
  __syncthreads();
  return v + pre;
}

// The first id at which the running sum of weight(i) in id order reaches target (>= 1); -1: never.
template <class W>
__device__ int first_in_id_order(int V, const W& weight, u64 target, Shared& sh) {
  u64 carry = 0;
  for (int base = 0; base < V; base += kThreads) {
    const int i = base + int(threadIdx.x);
    const u64 w = i < V ? weight(i) : 0;
    u64 total;
    const u64 incl = block_scan(w, sh, &total);
    if (carry + total >= target) {  // the same on every thread
      if (w > 0 && carry + incl >= target && carry + incl - w < target) sh.ivalue = i;
      __syncthreads();
      const int id = sh.ivalue;
      __syncthreads();
      return id;
    }
    carry += total;
  }
  return -1;
}

// The last element of the shortest prefix of the descending order (key, then the lower id) whose
// weights reach target (1 <= target <= the sum of all weights).
struct Boundary {
  uint32_t key;
  int id;
  __device__ bool contains(uint32_t k, int i) const { return k > key || (k == key && i <= id); }
};

template <class K, class W>
__device__ Boundary last_of_prefix(int V, const K& key, const W& weight, u64 target, Shared& sh) {
  constexpr int kShift[3] = {21, 10, 0}, kBits[3] = {11, 11, 10};
  uint32_t prefix = 0;
  u64 above = 0;  // weight of the keys above the digits chosen so far
  for (int level = 0; level < 3; ++level) {
    const int shift = kShift[level], bits = kBits[level], nb = 1 << bits;
    for (int b = threadIdx.x; b < nb; b += kThreads) sh.hist_lo[b] = sh.hist_hi[b] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += kThreads) {
      const uint32_t k = key(i);
      if (level > 0 && (k >> (shift + bits)) != prefix) continue;
      const u64 w = weight(i);
      if (w) add_bin(sh, (k >> shift) & uint32_t(nb - 1), w);
    }
    __syncthreads();
    // Bins from the top: thread t holds the (2t)-th and (2t+1)-th highest.
    const int j0 = 2 * int(threadIdx.x), j1 = j0 + 1;
    const u64 h0 = j0 < nb ? bin(sh, nb - 1 - j0) : 0, h1 = j1 < nb ? bin(sh, nb - 1 - j1) : 0;
    u64 total;
    const u64 before = above + block_scan(h0 + h1, sh, &total) - h0 - h1;
    if (before < target && before + h0 >= target) {
      sh.ivalue = nb - 1 - j0;
      sh.value = before;
    } else if (before + h0 < target && before + h0 + h1 >= target) {
      sh.ivalue = nb - 1 - j1;
      sh.value = before + h0;
    }
    __syncthreads();
    prefix = (prefix << bits) | uint32_t(sh.ivalue);
    above = sh.value;
    __syncthreads();
  }
  const uint32_t tau = prefix;
  // The boundary key's weighted elements: usually one, which is then the boundary; else walk them in
  // id order.
  if (threadIdx.x == 0) {
    sh.tie_count = 0;
    sh.tie_min = INT_MAX;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < V; i += kThreads)
    if (key(i) == tau && weight(i) > 0) {
      atomicAdd(&sh.tie_count, 1);
      atomicMin(&sh.tie_min, i);
    }
  __syncthreads();
  const int ties = sh.tie_count, first = sh.tie_min;
  __syncthreads();
  if (ties == 1) return {tau, first};
  const int id = first_in_id_order(
      V, [&](int i) { return key(i) == tau ? weight(i) : u64(0); }, target - above, sh);
  return {tau, id};
}

// Block argmax (ties: the lowest id), broadcast.
__device__ __forceinline__ void block_argmax(float& v, int& id, Shared& sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, id, o);
    if (ov > v || (ov == v && oi < id)) {
      v = ov;
      id = oi;
    }
  }
  if (lane == 0) {
    sh.fw[w] = v;
    sh.iw[w] = id;
  }
  __syncthreads();
  v = sh.fw[0];
  id = sh.iw[0];
  for (int k = 1; k < kWarps; ++k)
    if (sh.fw[k] > v || (sh.fw[k] == v && sh.iw[k] < id)) {
      v = sh.fw[k];
      id = sh.iw[k];
    }
  __syncthreads();
}

// Merges (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

__device__ __forceinline__ float block_lse(float m, float s, Shared& sh) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  for (int o = 16; o > 0; o >>= 1)
    lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  if (lane == 0) {
    sh.fw[w] = m;
    sh.fw2[w] = s;
  }
  __syncthreads();
  m = sh.fw[0];
  s = sh.fw2[0];
  for (int k = 1; k < kWarps; ++k) lse_merge(m, s, sh.fw[k], sh.fw2[k]);
  __syncthreads();
  return m + logf(s);
}

// A row's logit edits (sample_rows.h: DeviceLogitEdit) in the host sampler's float arithmetic (no
// contraction: the same bits as engine/sampler.cc), in place; each edited logit's raw value goes to
// `raw`, and with a logprob wanted the raw row's log-sum-exp to lse[r] first (the sampler then
// scores the token in the unedited distribution, as the host does). Rows without edits return at once.
__global__ void __launch_bounds__(kThreads)
    apply_edits_kernel(float* logits, int64_t ld, int V, const DeviceSampleRow* rows,
                       const DeviceLogitEdit* edits, float* raw, float* lse) {
  pdl_entry();
  __shared__ Shared sh;
  const int r = blockIdx.x;
  const DeviceSampleRow p = rows[r];
  if (p.edit_count == 0) return;
  float* x = logits + int64_t(r) * ld;
  if (p.logprob) {
    float m = -INFINITY, sum = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) lse_merge(m, sum, x[i], 1.0f);
    const float l = block_lse(m, sum, sh);
    if (threadIdx.x == 0) lse[r] = l;
  }
  __syncthreads();
  const bool counts = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  for (int j = threadIdx.x; j < p.edit_count; j += kThreads) {
    const DeviceLogitEdit e = edits[p.edit_begin + j];
    if (e.token < 0 || e.token >= V) continue;
    float v = x[e.token];
    raw[p.edit_begin + j] = v;
    if (e.flags & kEditBias) v = __fadd_rn(v, e.bias);
    if (e.flags & kEditRepeated)
      v = v > 0.0f ? __fdiv_rn(v, p.repetition_penalty) : __fmul_rn(v, p.repetition_penalty);
    if (counts && e.count > 0)
      v = __fsub_rn(v, __fadd_rn(p.presence_penalty, __fmul_rn(p.frequency_penalty, float(e.count))));
    x[e.token] = v;
  }
}

__global__ void __launch_bounds__(kThreads)
    sample_rows_kernel(int32_t* out, const float* logits, int64_t ld, int V, const DeviceSampleRow* rows,
                       const uint32_t* masks, int mask_words, const DeviceLogitEdit* edits, const float* raw,
                       const float* lse_of_edited) {
  pdl_entry();
  __shared__ Shared sh;
  const int r = blockIdx.x;
  const DeviceSampleRow p = rows[r];
  const float* x = logits + int64_t(r) * ld;
  const bool edited = p.edit_count > 0;  // x holds the edited logits (apply_edits_kernel)
  const uint32_t* m = p.mask_row >= 0 ? masks + int64_t(p.mask_row) * mask_words : nullptr;
  auto val = [&](int i) { return (!m || ((m[i >> 5] >> (i & 31)) & 1u)) ? x[i] : -INFINITY; };

  // Pass 1: the masked argmax; the raw logits' log-sum-exp when a logprob is wanted.
  float best = -INFINITY, rmax = -INFINITY, rsum = 0;
  int bi = INT_MAX;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    const float v = val(i);
    if (v > best || bi == INT_MAX) {  // the first of equals in this thread's (ascending) ids
      best = v;
      bi = i;
    }
    if (p.logprob && !edited) lse_merge(rmax, rsum, x[i], 1.0f);
  }
  block_argmax(best, bi, sh);
  int token = bi;

  if (p.temperature > 0.0f) {
    const float mx = best, inv_t = 1.0f / p.temperature;
    auto prob = [&](float v) { return v == -INFINITY ? 0.0f : __expf((v - mx) * inv_t); };
    auto key = [&](int i) { return order_key(val(i)); };
    const bool topk = p.top_k > 0 && p.top_k < V, topp = p.top_p<1.0f, minp = p.min_p> 0.0f;
    if (!topk && !topp && !minp) {
      // No filter: the host walks the whole vocabulary in id order.
      auto w = [&](int i) { return fixed(prob(val(i))); };
      u64 local = 0;
      for (int i = threadIdx.x; i < V; i += kThreads) local += w(i);
      const u64 total = block_sum(local, sh);
      const int t = first_in_id_order(V, w, u64(p.u * double(total)) + 1, sh);
      if (t >= 0) token = t;
    } else {
      Boundary bk{0, INT_MAX};
      if (topk)
        bk = last_of_prefix(
            V, key, [](int) { return u64(1); }, u64(p.top_k), sh);
      auto w_k = [&](int i) {
        const float v = val(i);
        return bk.contains(order_key(v), i) ? fixed(prob(v)) : u64(0);
      };
      u64 local = 0;
      for (int i = threadIdx.x; i < V; i += kThreads) local += w_k(i);
      const u64 sum_k = block_sum(local, sh);  // top_p's normalizer: the top-k mass (or all)
      Boundary bp{0, INT_MAX};
      if (topp) {
        const u64 target = u64(ceil(double(p.top_p) * double(sum_k)));
        bp = last_of_prefix(V, key, w_k, target < 1 ? 1 : target, sh);
      }
      const int top = bi;
      auto kept = [&](int i) {
        const float v = val(i);
        const uint32_t k = order_key(v);
        if (!bk.contains(k, i) || !bp.contains(k, i)) return u64(0);
        const float q = prob(v);
        if (minp && q < p.min_p && i != top) return u64(0);  // the top token always stays (as on the host)
        return fixed(q);
      };
      local = 0;
      for (int i = threadIdx.x; i < V; i += kThreads) local += kept(i);
      const u64 total = block_sum(local, sh);
      const Boundary b = last_of_prefix(V, key, kept, u64(p.u * double(total)) + 1, sh);
      if (b.id >= 0) token = b.id;
    }
  }

  float lp = 0;
  int rank = 0;
  // The raw distribution's log-sum-exp (an edited row's was taken before its edits).
  const float lse = !p.logprob ? 0.0f : edited ? lse_of_edited[r] : block_lse(rmax, rsum, sh);
  if (p.logprob && !edited) {
    lp = x[token] - lse;
    u64 local = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) local += (x[i] - lse >= lp) ? 1 : 0;
    rank = int(block_sum(local, sh));
  } else if (p.logprob) {
    // The raw distribution: x[i] unless edited, then raw[] has it.
    if (threadIdx.x == 0) sh.fvalue = x[token];
    __syncthreads();
    for (int j = threadIdx.x; j < p.edit_count; j += kThreads)
      if (edits[p.edit_begin + j].token == token) sh.fvalue = raw[p.edit_begin + j];  // one entry per token
    __syncthreads();
    lp = sh.fvalue - lse;
    __syncthreads();
    u64 local = 0;
    for (int i = threadIdx.x; i < V; i += kThreads) local += (x[i] - lse >= lp) ? 1 : 0;
    for (int j = threadIdx.x; j < p.edit_count; j += kThreads) {  // edited entries: count the raw value
      const int t = edits[p.edit_begin + j].token;
      if (t < 0 || t >= V) continue;
      local -= (x[t] - lse >= lp) ? 1 : 0;
      local += (raw[p.edit_begin + j] - lse >= lp) ? 1 : 0;
    }
    rank = int(block_sum(local, sh));
  }
  // The raw distribution's best k: the prefix of k of the descending order (as the host's partial
  // selection: ties to the lower id), gathered, then sorted by logprob and id.
  const int k = p.logprob && !edited ? min(p.top_logprobs, min(V, kMaxTopLogprobs)) : 0;
  if (k > 0) {
    const Boundary b = last_of_prefix(
        V, [&](int i) { return order_key(x[i]); }, [](int) { return u64(1); }, u64(k), sh);
    if (threadIdx.x == 0) sh.top_n = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < V; i += kThreads)
      if (b.contains(order_key(x[i]), i)) {
        const int at = atomicAdd(&sh.top_n, 1);
        if (at < kMaxTopLogprobs) {
          sh.top_id[at] = i;
          sh.top_lp[at] = x[i] - lse;
        }
      }
    __syncthreads();
    if (threadIdx.x == 0)
      for (int a = 1; a < k; ++a)  // insertion sort of k <= 20
        for (int c = a; c > 0; --c) {
          const float v0 = sh.top_lp[c - 1], v1 = sh.top_lp[c];
          if (!(v1 > v0 || (v1 == v0 && sh.top_id[c] < sh.top_id[c - 1]))) break;
          const int ti = sh.top_id[c];
          sh.top_id[c] = sh.top_id[c - 1];
          sh.top_id[c - 1] = ti;
          sh.top_lp[c] = v0;
          sh.top_lp[c - 1] = v1;
        }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    int32_t* o = out + int64_t(r) * kSampleOutCols;
    o[0] = token;
    o[1] = __float_as_int(lp);
    o[2] = rank;
    o[3] = k;
    for (int j = 0; j < k; ++j) {
      o[4 + 2 * j] = sh.top_id[j];
      o[5 + 2 * j] = __float_as_int(sh.top_lp[j]);
    }
  }
}

}  // namespace beluga::cuda::sampling
