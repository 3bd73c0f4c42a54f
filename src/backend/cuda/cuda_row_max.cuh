// A row's maximum, its first index and the sum of exp(l - max) in one pass, kept per thread and
// merged across threads and blocks in any order with the same id (ties: the lowest index): the
// argmax of argmax_rows and of the head's fused GEMV (head_argmax).
#pragma once

#include <climits>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"

namespace beluga::cuda {

// A thread's running maximum (its first index) and, with kProbs, the sum of exp(l - max) over the
// elements it saw, rescaled whenever the maximum rises: one pass over the row.
struct RowMax {
  float m = -INFINITY, s = 0;
  int i = INT_MAX;
};

template <bool kProbs>
__device__ __forceinline__ void push(RowMax& r, float v, int i) {
  if (v > r.m || r.i == INT_MAX) {  // strictly greater: the lowest index wins ties within a thread
    if (kProbs) r.s = r.i == INT_MAX ? 1.0f : r.s * __expf(r.m - v) + 1.0f;
    r.m = v;
    r.i = i;
  } else if (kProbs && r.m > -INFINITY) {
    r.s += __expf(v - r.m);
  }
}

template <bool kProbs>
__device__ __forceinline__ void merge(RowMax& r, const RowMax& o) {
  const bool take = o.m > r.m || (o.m == r.m && o.i < r.i);
  if (kProbs) {
    const float m = fmaxf(r.m, o.m);
    r.s = m == -INFINITY ? r.s + o.s : r.s * __expf(r.m - m) + o.s * __expf(o.m - m);
  }
  if (take) {
    r.m = o.m;
    r.i = o.i;
  }
}

// Merges the warp's 32 values into every lane's.
template <bool kProbs>
__device__ __forceinline__ void warp_merge(RowMax& r) {
  for (int o = 16; o > 0; o >>= 1) {
    RowMax x;
    x.m = __shfl_xor_sync(0xffffffffu, r.m, o);
    x.s = __shfl_xor_sync(0xffffffffu, r.s, o);
    x.i = __shfl_xor_sync(0xffffffffu, r.i, o);
    merge<kProbs>(r, x);
  }
}

}  // namespace beluga::cuda
