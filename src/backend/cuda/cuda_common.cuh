// Shared helpers of the CUDA backend's translation units: error checks, BF16 conversion, warp
// reductions and the mma.sync / ldmatrix / cp.async wrappers the tensor-core kernels use.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <utility>

#include "backend/ops.h"
#include "tensor/tensor.h"
#include "util/error.h"

namespace beluga::cuda {

#define BELUGA_CUDA_CHECK(expr)                                                    \
  do {                                                                             \
    cudaError_t err_ = (expr);                                                     \
    if (err_ != cudaSuccess)                                                       \
      ::beluga::fail("CUDA error at ", __FILE__, ":", __LINE__, ": ", #expr, ": ", \
                     cudaGetErrorString(err_));                                    \
  } while (0)

#define BELUGA_CUBLAS_CHECK(expr)                                                               \
  do {                                                                                          \
    cublasStatus_t st_ = (expr);                                                                \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                           \
      ::beluga::fail("cuBLAS error at ", __FILE__, ":", __LINE__, ": ", #expr, ": ", int(st_)); \
  } while (0)

// After a launch: reports a bad configuration at once (execution errors surface at the next sync).
#define BELUGA_LAUNCH_CHECK() BELUGA_CUDA_CHECK(cudaGetLastError())

using bf16 = __nv_bfloat16;

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

__device__ __forceinline__ float to_f(bf16 v) {
  return __bfloat162float(v);
}
__device__ __forceinline__ float to_f(float v) {
  return v;
}
template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float v) {
  return __float2bfloat16(v);
}

// A 1-D vector of norm weights or biases: F32 or BF16.
struct VecRef {
  const void* p;
  bool f32;
  __device__ __forceinline__ float operator[](int64_t i) const {
    return f32 ? static_cast<const float*>(p)[i] : __bfloat162float(static_cast<const bf16*>(p)[i]);
  }
};

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// silu(g) * u as the expert kernels' epilogues compute it; with limit > 0 (DeepSeek-V4's swiglu_limit)
// g is clamped to <= limit and u to [-limit, limit] first.
__device__ __forceinline__ float swiglu(float g, float u, float limit) {
  if (limit > 0.0f) {
    g = fminf(g, limit);
    u = fminf(fmaxf(u, -limit), limit);
  }
  return g / (1.0f + __expf(-g)) * u;
}

inline cudaStream_t S(void* s) {
  return static_cast<cudaStream_t>(s);
}

// Whether `st` is recording a graph (nothing may allocate or synchronise then).
inline bool capturing(cudaStream_t st) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  BELUGA_CUDA_CHECK(cudaStreamIsCapturing(st, &status));
  return status != cudaStreamCaptureStatusNone;
}

// ---- programmatic dependent launch (PDL, sm_90) ----
// With PDL, a kernel launched by launch() may start while the previous kernel in the stream is still
// running, so every kernel calls pdl_entry() before it reads or writes anything in memory (weights
// too: the first use of an F32/FP8 weight converts it in the kernel before). pdl_entry() waits until
// the previous kernel has finished and its writes are visible, then lets the next kernel start
// launching; without PDL it costs nothing. On by default since session 9 (bench/NOTES.md run 97): V2-Lite
// batch-1 decode 2.28 -> 2.22 ms, and with it a side stream no longer slows later graphs (runs 86-93).
// Sessions 3-5 measured it 2.5 % slower at batch 1 on the kernels of then. BELUGA_CUDA_PDL=0 turns it off.
__device__ __forceinline__ void pdl_entry() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches carry the programmatic-serialization attribute unless BELUGA_CUDA_PDL=0; read once.
inline bool pdl_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("BELUGA_CUDA_PDL");
    return !(v && v[0] == '0');
  }();
  return on;
}

template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  BELUGA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

// Lets `kernel` launch with up to `bytes` of dynamic shared memory on the current device. The permission
// belongs to the device, so CudaOps grants it for its own device when it is created (cuda_kernel_config.h).
template <typename... KArgs>
void allow_dynamic_smem(void (*kernel)(KArgs...), int bytes) {
  BELUGA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

// Grid for a grid-stride loop over n elements: enough blocks to cover it, at most 65536.
inline int grid_for(int64_t n, int threads = 256) {
  return int(std::min<int64_t>(std::max<int64_t>(ceil_div(n, threads), 1), 65536));
}

inline void check_bf16_rows(const Tensor& t, const char* what) {
  BELUGA_CHECK(t.dtype == DType::kBF16 && t.ndim == 2 && t.stride[1] == 1, what,
               " must be a BF16 [rows, cols] matrix with unit column stride, got ", t.describe());
}

inline VecRef vec(const Tensor& t) {
  BELUGA_CHECK(t.dtype == DType::kF32 || t.dtype == DType::kBF16, "vector must be F32 or BF16, got ",
               t.describe());
  return VecRef{t.data, t.dtype == DType::kF32};
}

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15) == 0;
}
// Whether BF16 rows of `cols` columns at these strides and pointers can move in 16-byte pieces.
inline bool rows16(int64_t cols, std::initializer_list<int64_t> strides,
                   std::initializer_list<const void*> ptrs) {
  if (cols % 8) return false;
  for (int64_t st : strides)
    if (st % 8) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  return true;
}

// 16-byte weight loads for streaming GEMVs: read once, so they bypass L1. Not volatile, so the
// compiler may issue the loads of an unrolled loop together.
__device__ __forceinline__ uint4 ld_stream(const bf16* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// ld_stream that the compiler keeps where it is written (volatile): loads issued ahead of a
// prologue's barriers, whose latency the prologue then hides.
__device__ __forceinline__ uint4 ld_stream_early(const bf16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Dot product of 8 BF16 pairs in F32.
// Eight BF16 values (16 bytes) as F32.
__device__ __forceinline__ void unpack8(uint4 v, float (&f)[8]) {
  const bf16* b = reinterpret_cast<const bf16*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) f[i] = to_f(b[i]);
}
// sum_i x[i] * f[i] over eight F32 values x (16-byte aligned, e.g. in shared memory).
__device__ __forceinline__ float dot8(const float* x, const float (&f)[8]) {
  const float4 a = reinterpret_cast<const float4*>(x)[0], b = reinterpret_cast<const float4*>(x)[1];
  return a.x * f[0] + a.y * f[1] + a.z * f[2] + a.w * f[3] + b.x * f[4] + b.y * f[5] + b.z * f[6] +
         b.w * f[7];
}
__device__ __forceinline__ float dot8(uint4 w, uint4 x) {
  const __nv_bfloat162* a = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* b = reinterpret_cast<const __nv_bfloat162*>(&x);
  float acc = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 fa = __bfloat1622float2(a[i]), fb = __bfloat1622float2(b[i]);
    acc = fmaf(fa.x, fb.x, acc);
    acc = fmaf(fa.y, fb.y, acc);
  }
  return acc;
}

// Thread 0 of a block, between two __syncthreads(): counts the block in and returns the count before.
// Release: the block's writes before the barrier are visible to whoever sees the count; acquire: the
// writes of the blocks counted before are visible to this block after the second barrier.
__device__ __forceinline__ int arrive(int* counter) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
  return old;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* red /* [33] shared */) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    float x = lane < nw ? red[lane] : 0.0f;
    x = warp_sum(x);
    if (lane == 0) red[32] = x;
  }
  __syncthreads();
  return red[32];
}
__device__ __forceinline__ float block_max(float v, float* red /* [33] shared */) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) red[w] = v;
  __syncthreads();
  if (w == 0) {
    float x = lane < nw ? red[lane] : -INFINITY;
    x = warp_max(x);
    if (lane == 0) red[32] = x;
  }
  __syncthreads();
  return red[32];
}

// ---- tensor-core building blocks (sm_80+ mma.sync; fragment layouts of PTX m16n8k16) ----
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16-byte async copy; src_bytes 0 fills the destination with zeros (out-of-range rows).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(n));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x2(uint32_t (&r)[2], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(smem_addr(p)));
}
// d += a (16x16 bf16, row) * b (16x8 bf16, col), F32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// ---- the paged KV cache ----
// The longest sequence (cached + new tokens) of a step, at least 1.
inline int max_keys(const AttnMeta& m) {
  int mx = 1;
  for (int s = 0; s < m.num_seqs; ++s)
    mx = std::max(mx, m.h_context_len[s] + m.h_query_start[s + 1] - m.h_query_start[s]);
  return mx;
}

inline void check_cache(const Tensor& cache) {
  BELUGA_CHECK(cache.dtype == DType::kBF16 && cache.ndim == 3 && cache.is_contiguous(),
               "CUDA KV cache must be a contiguous BF16 [blocks, block_size, entry] tensor, got ",
               cache.describe());
}

// Index of the sequence holding token row t (query_start is [S + 1], ascending).
__device__ __forceinline__ int seq_of_token(const int32_t* query_start, int num_seqs, int t) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (query_start[mid] <= t)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace beluga::cuda

#include <vector>

#include "backend/cuda/cuda_ops.h"

// One MoE layer's experts as the grouped GEMM sees them (the shared expert, if any, is the last).
struct beluga::CudaOps::ExpertTable {
  void* dev = nullptr;                // one allocation: ptrs [3][ne] then inter [ne]
  const void* const* ptrs = nullptr;  // gate[ne], up[ne], down[ne] (BF16 [I, D], [I, D], [D, I])
  const int* inter = nullptr;         // I of each expert
  int ne = 0, i_max = 0, d = 0;
  int i_routed = 0;  // the routed experts' common width (0: they differ)
  int i_shared = 0;  // the shared expert's width (0: none)
  // The weights' own data pointers (gate, up, down of each expert): tables are cached by the address of
  // the expert list, so a different weight set at that address must not reuse them.
  std::vector<const void*> sources;
  // A graph recorded with this table holds its device pointers: it must never change. An eager-only
  // table (expert-parallel ranks, whose placement live EPLB rewrites) is rebuilt instead.
  bool captured = false;
  ExpertTable() = default;
  ExpertTable(const ExpertTable&) = delete;
  ExpertTable& operator=(const ExpertTable&) = delete;
  ~ExpertTable() { cudaFree(dev); }
};
