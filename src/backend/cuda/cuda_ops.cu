// CudaOps: memory, host transfers, graphs and element-wise ops. Dense products live in cuda_linear.cu,
// MoE in cuda_moe*.cu, attention and the KV cache in cuda_attention.cu, the machine's limits in
// cuda_machine_limits.cu, the on-device dummy weights in cuda_dummy_weights.cu.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_kernel_config.h"
#include "backend/cuda/cuda_norm.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

constexpr size_t kAlign = 256;
inline size_t align_up(size_t n) {
  return (n + kAlign - 1) & ~(kAlign - 1);
}

int64_t numel_of(std::initializer_list<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void fill_uniform_kernel(T* p, int64_t n, uint64_t seed, float lo, float hi) {
  pdl_entry();
  const float span = hi - lo;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float v = lo;
    // No contraction into FMA: the values must equal DummyWeights' host arithmetic bit for bit.
    if (span > 0)
      v = __fadd_rn(
          lo, __fmul_rn(__fmul_rn(span, float(mix64(seed + uint64_t(i)) >> 40)), 1.0f / float(1 << 24)));
    p[i] = from_f<T>(v);
  }
}

// One block per row, in block_rmsnorm_rows' order (element-strided when the rows are not in 16-byte
// chunks): res_out = residual + delta when there is a delta, out = w * (that / rms(that)).
__global__ void __launch_bounds__(kNormThreads) rmsnorm_kernel(NormArgs n, bool vectorized) {
  pdl_entry();
  __shared__ float red[33];
  const int r = blockIdx.x;
  bf16* dst = n.out + int64_t(r) * n.ldo;
  bf16* sum = n.delta ? n.res_out + int64_t(r) * n.ldro : nullptr;
  if (vectorized) {
    block_rmsnorm_rows<1>(n, r, 1, sum, 0, dst, 0, false);
    return;
  }
  const bf16* res = n.residual + int64_t(r) * n.ldr;
  if (sum)
    for (int d = threadIdx.x; d < n.D; d += kNormThreads)
      sum[d] = __float2bfloat16(to_f(res[d]) + to_f(n.delta[int64_t(r) * n.ldd + d]));
  const bf16* src = sum ? sum : res;  // each thread reads back only what it wrote
  const float inv = rsqrtf(block_row_sumsq(src, n.D, false, red) / float(n.D) + n.eps);
  for (int d = threadIdx.x; d < n.D; d += kNormThreads)
    dst[d] = __float2bfloat16(n.w[d] * (to_f(src[d]) * inv));
}

__global__ void add_kernel(bf16* out, int64_t ldo, const bf16* a, int64_t lda, const bf16* b, int64_t ldb,
                           int R, int D) {
  pdl_entry();
  const int64_t n = int64_t(R) * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, d = i % D;
    out[r * ldo + d] = __float2bfloat16(to_f(a[r * lda + d]) + to_f(b[r * ldb + d]));
  }
}

// Strided copy of up to 3 dims with dtype conversion.
template <typename TO, typename TI>
__global__ void copy_kernel(TO* out, int64_t o0, int64_t o1, int64_t o2, const TI* x, int64_t x0, int64_t x1,
                            int64_t x2, int64_t n1, int64_t n2, int64_t n) {
  pdl_entry();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t c = i % n2, b = (i / n2) % n1, a = i / (n1 * n2);
    out[a * o0 + b * o1 + c * o2] = from_f<TO>(to_f(x[a * x0 + b * x1 + c * x2]));
  }
}

__global__ void silu_mul_kernel(bf16* out, int64_t ldo, const bf16* gu, int64_t ldg, int R, int I) {
  pdl_entry();
  const int64_t n = int64_t(R) * I;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / I, c = i % I;
    const float g = to_f(gu[r * ldg + c]), u = to_f(gu[r * ldg + I + c]);
    out[r * ldo + c] = __float2bfloat16(g / (1.0f + __expf(-g)) * u);
  }
}

// silu_mul_kernel on 8 columns per thread (16-byte loads and stores; I, the strides and the pointers
// 16-byte aligned): the same values. Element-wise kernels with 2-byte accesses and a 64-bit division per
// element ran at ~1.1 TB/s on the 8K prefill's [49K, 2 x 1408] gate-up rows (bench/NOTES.md run 53).
__global__ void silu_mul8_kernel(bf16* out, int64_t ldo, const bf16* gu, int64_t ldg, int R, int I) {
  pdl_entry();
  const int I8 = I / 8;
  const int64_t n = int64_t(R) * I8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / I8;
    const int c = int(i - r * I8) * 8;
    const uint4 gv = *reinterpret_cast<const uint4*>(gu + r * ldg + c);
    const uint4 uv = *reinterpret_cast<const uint4*>(gu + r * ldg + I + c);
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
    uint4 o;
    uint32_t* o2 = reinterpret_cast<uint32_t*>(&o);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 g = __bfloat1622float2(g2[j]), u = __bfloat1622float2(u2[j]);
      o2[j] = pack_bf16(g.x / (1.0f + __expf(-g.x)) * u.x, g.y / (1.0f + __expf(-g.y)) * u.y);
    }
    *reinterpret_cast<uint4*>(out + r * ldo + c) = o;
  }
}

// x [T, H, dim] (strides s0, s1, unit last); rotates the first 2*half values of each head.
__global__ void rope_kernel(bf16* x, int64_t s0, int64_t s1, int T, int H, int half, const int32_t* pos,
                            const float* cos_t, const float* sin_t, bool interleaved) {
  pdl_entry();
  const int64_t n = int64_t(T) * H * half;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int k = int(i % half);
    const int64_t h = (i / half) % H, t = i / (int64_t(half) * H);
    bf16* v = x + t * s0 + h * s1;
    const int p = pos[t];
    const float c = cos_t[int64_t(p) * half + k], s = sin_t[int64_t(p) * half + k];
    bf16* a = interleaved ? v + 2 * k : v + k;
    bf16* b = interleaved ? v + 2 * k + 1 : v + k + half;
    const float x0 = to_f(*a), x1 = to_f(*b);
    *a = __float2bfloat16(x0 * c - x1 * s);
    *b = __float2bfloat16(x1 * c + x0 * s);
  }
}

// out[i] = table[ids[i]] (embedding) or x[rows[i]] (gather_rows), converted to BF16.
template <typename T>
__global__ void gather_kernel(bf16* out, int64_t ldo, const T* src, int64_t lds, const int32_t* idx, int R,
                              int D) {
  pdl_entry();
  const int64_t n = int64_t(R) * D;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D, d = i % D;
    out[r * ldo + d] = __float2bfloat16(to_f(src[int64_t(idx[r]) * lds + d]));
  }
}

__global__ void gather_ids_kernel(int32_t* out, const int32_t* ids, const int32_t* rows, int R) {
  pdl_entry();
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < R; r += gridDim.x * blockDim.x)
    out[r] = ids[rows[r]];
}

// gather_kernel for BF16 rows in 16-byte pieces (D, the strides and the pointers 16-byte aligned).
__global__ void gather_rows8_kernel(bf16* out, int64_t ldo, const bf16* src, int64_t lds, const int32_t* idx,
                                    int R, int D) {
  pdl_entry();
  const int D8 = D / 8;
  const int64_t n = int64_t(R) * D8;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / D8;
    const int c = int(i - r * D8) * 8;
    *reinterpret_cast<uint4*>(out + r * ldo + c) =
        *reinterpret_cast<const uint4*>(src + int64_t(idx[r]) * lds + c);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
CudaOps::CudaOps(CudaOptions opt) {
  int n = 0;
  BELUGA_CUDA_CHECK(cudaGetDeviceCount(&n));
  BELUGA_CHECK(n > opt.device, "CUDA device ", opt.device, " not present (", n, " devices)");
  BELUGA_CUDA_CHECK(cudaSetDevice(opt.device));
  device_ = opt.device;
  cudaDeviceProp prop{};
  BELUGA_CUDA_CHECK(cudaGetDeviceProperties(&prop, opt.device));
  BELUGA_CHECK(prop.major >= 9, "the CUDA backend is built for sm_90a (Hopper); device ", prop.name,
               " is sm_", prop.major, prop.minor);
  sm_count_ = prop.multiProcessorCount;
  l2_bytes_ = prop.l2CacheSize;
  configure_mla_decode_kernels();
  configure_mla_prefill_kernels();
  configure_moe_kernels(int(prop.sharedMemPerBlockOptin));
  configure_swap_kernels();
  configure_wgmma_kernels();
  configure_invariant_gemm_kernels();
  configure_v4_attention_kernels();
  configure_v4_indexer_kernels();
  const char* prof = std::getenv("BELUGA_CUDA_PROFILE");
  profile_ = prof && std::string(prof) == "1";
  token_experts_ = opt.token_experts;
  wgmma_experts_ = opt.wgmma_experts;
  if (const char* v = std::getenv("BELUGA_MOE_WGMMA")) wgmma_experts_ = wgmma_experts_ && v[0] != '0';
  swap_experts_ = opt.swap_experts && wgmma_experts_;
  if (const char* v = std::getenv("BELUGA_MOE_SWAP")) swap_experts_ = swap_experts_ && v[0] != '0';
  shared_experts_cublas_ = opt.shared_experts_cublas;
  if (const char* v = std::getenv("BELUGA_MOE_SHARED_CUBLAS"))
    shared_experts_cublas_ = shared_experts_cublas_ && v[0] != '0';
  shared_on_side_ = opt.shared_on_side;
  if (const char* v = std::getenv("BELUGA_MOE_SHARED_SIDE")) shared_on_side_ = shared_on_side_ && v[0] != '0';
  if (const char* v = std::getenv("BELUGA_MLA_BY_LENGTH")) mla_by_length_ = v[0] != '0';
  if (const char* v = std::getenv("BELUGA_MLA_DECODE_BUFS")) {
    mla_decode_bufs_ = std::atoi(v);
    BELUGA_CHECK(mla_decode_bufs_ >= 0 && mla_decode_bufs_ <= 2,
                 "BELUGA_MLA_DECODE_BUFS must be 0, 1 or 2, got ", v);
  }
  if (const char* v = std::getenv("BELUGA_MLA_TILE_SPLITS")) mla_tile_splits_ = std::max(0, std::atoi(v));
  if (const char* v = std::getenv("BELUGA_MLA_MIN_SPLIT")) {
    mla_min_split_ = std::atoi(v);
    BELUGA_CHECK(mla_min_split_ >= 64 && mla_min_split_ % 64 == 0,
                 "BELUGA_MLA_MIN_SPLIT must be a positive multiple of 64 (the decode tile), got ", v);
  }
  if (opt.deterministic) {  // one expert path for every row count (cuda_ops.h, CudaOptions::deterministic)
    deterministic_ = true;
    token_experts_ = wgmma_experts_ = swap_experts_ = shared_experts_cublas_ = shared_on_side_ = false;
    opt.moe_prefill = MoePrefill::kKernel;
  }
  if (opt.moe_prefill) {
    moe_prefill_ = *opt.moe_prefill;
  } else if (const char* m = std::getenv("BELUGA_MOE_PREFILL")) {
    const std::string v = m;
    BELUGA_CHECK(v == "auto" || v == "kernel" || v == "per-expert" || v == "cublas-grouped",
                 "BELUGA_MOE_PREFILL must be auto, kernel, per-expert or cublas-grouped, got ", v);
    moe_prefill_ = v == "kernel"           ? MoePrefill::kKernel
                   : v == "per-expert"     ? MoePrefill::kPerExpert
                   : v == "cublas-grouped" ? MoePrefill::kCublasGrouped
                                           : MoePrefill::kAuto;
  }
  cudaStream_t st;
  BELUGA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  stream_ = st;
  cublasHandle_t h;
  BELUGA_CUBLAS_CHECK(cublasCreate(&h));
  BELUGA_CUBLAS_CHECK(cublasSetStream(h, st));
  const size_t ws = size_t(32) << 20;
  BELUGA_CUDA_CHECK(cudaMalloc(&cublas_ws_, ws));
  BELUGA_CUBLAS_CHECK(cublasSetWorkspace(h, cublas_ws_, ws));
  cublas_ = h;
  // Up front, so that no first use falls inside a graph capture.
  counters_ = alloc_persistent(DType::kI32, {kArrivalCounters}).ptr<int>();
}

CudaOps::Prof::Prof(CudaOps* o, const char* n) : ops(o), name(n), t0(0) {
  if (!ops->profile_) return;
  cudaStreamSynchronize(S(ops->stream_));
  t0 = std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

CudaOps::Prof::~Prof() {
  if (!ops->profile_) return;
  cudaStreamSynchronize(S(ops->stream_));
  auto& e = ops->prof_[name];
  e.first += std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() - t0;
  e.second++;
}

CudaOps::~CudaOps() {
  cudaStreamSynchronize(S(stream_));
  if (profile_) {
    double total = 0;
    for (auto& [k, v] : prof_) total += v.first;
    std::fprintf(stderr, "CUDA op profile (synchronised per op): %.1f ms total\n", total * 1e3);
    for (auto& [k, v] : prof_)
      std::fprintf(stderr, "  %-24s %10.2f ms %8ld calls %8.1f us/call %5.1f%%\n", k.c_str(), v.first * 1e3,
                   v.second, v.first * 1e6 / double(v.second), 100.0 * v.first / total);
  }
  for (void* g : graphs_)
    if (g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));
  expert_tables_.clear();
  for (void* p : chunks_) cudaFree(p);
  for (void* p : persistent_) cudaFree(p);
  for (SideStream& x : side_) {
    cudaStreamSynchronize(S(x.stream));
    cublasDestroy(static_cast<cublasHandle_t>(x.cublas));
    cudaFree(x.ws);
    cudaEventDestroy(static_cast<cudaEvent_t>(x.done));
    cudaStreamDestroy(S(x.stream));
  }
  if (fork_) cudaEventDestroy(static_cast<cudaEvent_t>(fork_));
  for (void* e : replay_events_)
    if (e) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  if (host_copy_event_) cudaEventDestroy(static_cast<cudaEvent_t>(host_copy_event_));
  cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  cudaFree(cublas_ws_);
  cudaStreamDestroy(S(stream_));
}

void CudaOps::make_side_streams() {
  if (!side_.empty()) return;
  cudaEvent_t ev = nullptr;
  BELUGA_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  fork_ = static_cast<void*>(ev);
  for (int i = 0; i < kSideStreams; ++i) {
    SideStream x;
    cudaStream_t st;
    BELUGA_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    x.stream = st;
    cublasHandle_t h;
    BELUGA_CUBLAS_CHECK(cublasCreate(&h));
    BELUGA_CUBLAS_CHECK(cublasSetStream(h, st));
    const size_t ws = size_t(32) << 20;
    BELUGA_CUDA_CHECK(cudaMalloc(&x.ws, ws));
    BELUGA_CUBLAS_CHECK(cublasSetWorkspace(h, x.ws, ws));
    x.cublas = h;
    cudaEvent_t done;
    BELUGA_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    x.done = done;
    side_.push_back(x);
  }
}

void CudaOps::fork_side_streams() {
  make_side_streams();
  BELUGA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(fork_), S(stream_)));
  for (SideStream& x : side_)
    BELUGA_CUDA_CHECK(cudaStreamWaitEvent(S(x.stream), static_cast<cudaEvent_t>(fork_), 0));
}

void CudaOps::join_side_streams() {
  for (SideStream& x : side_) {
    BELUGA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(x.done), S(x.stream)));
    BELUGA_CUDA_CHECK(cudaStreamWaitEvent(S(stream_), static_cast<cudaEvent_t>(x.done), 0));
  }
}

Tensor CudaOps::scratch(DType dtype, std::initializer_list<int64_t> shape) {
  const size_t bytes = align_up(size_t(std::max<int64_t>(numel_of(shape), 1)) * dtype_size(dtype));
  if (chunks_.empty() || used_ + bytes > chunk_size_.back()) {
    const size_t size = std::max(bytes, chunks_.empty() ? size_t(256) << 20 : chunk_size_.back() * 2);
    void* p = nullptr;
    BELUGA_CUDA_CHECK(cudaMalloc(&p, size));
    chunks_.push_back(p);
    chunk_size_.push_back(size);
    used_ = 0;
  }
  void* p = static_cast<char*>(chunks_.back()) + used_;
  used_ += bytes;
  return Tensor::make(p, dtype, shape.begin(), int(shape.size()), Device::kCuda);
}

void CudaOps::reset_scratch() {
  gate_plan_ = {};
  if (chunks_.size() > 1) {
    BELUGA_CUDA_CHECK(cudaStreamSynchronize(S(stream_)));
    size_t total = 0;
    for (size_t s : chunk_size_) total += s;
    for (void* p : chunks_) BELUGA_CUDA_CHECK(cudaFree(p));
    ++scratch_epoch_;  // recorded graphs point into the freed chunks
    chunks_.clear();
    chunk_size_.clear();
    void* p = nullptr;
    BELUGA_CUDA_CHECK(cudaMalloc(&p, total));
    chunks_.push_back(p);
    chunk_size_.push_back(total);
  }
  used_ = 0;
}

Tensor CudaOps::alloc_persistent(DType dtype, std::initializer_list<int64_t> shape) {
  const size_t bytes = size_t(std::max<int64_t>(numel_of(shape), 1)) * dtype_size(dtype);
  void* p = nullptr;
  BELUGA_CUDA_CHECK(cudaMalloc(&p, bytes));
  BELUGA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, S(stream_)));
  persistent_.push_back(p);
  persistent_bytes_ += bytes;
  return Tensor::make(p, dtype, shape.begin(), int(shape.size()), Device::kCuda);
}

int* CudaOps::arrival_counters(int64_t n) {
  BELUGA_CHECK(n <= kArrivalCounters, "arrival counters: ", n, " wanted, ", kArrivalCounters, " allocated");
  return counters_;
}

Tensor CudaOps::upload(const Tensor& host) {
  if (host.device == Device::kCuda) return host;  // produced on the device (CudaDummyWeights)
  BELUGA_CHECK(host.is_contiguous(), "upload: tensor must be contiguous, got ", host.describe());
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(host.nbytes(), 1);
  BELUGA_CUDA_CHECK(cudaMalloc(&p, bytes));
  persistent_.push_back(p);
  persistent_bytes_ += bytes;
  BELUGA_CUDA_CHECK(cudaMemcpy(p, host.data, host.nbytes(), cudaMemcpyHostToDevice));
  Tensor t = Tensor::make(p, host.dtype, host.shape.data(), host.ndim, Device::kCuda);
  return t;
}

std::shared_ptr<void> CudaOps::upload_owned(const Tensor& host, Tensor* out) {
  if (host.device == Device::kCuda) {  // produced on the device (CudaDummyWeights): the backend's
    *out = host;
    return nullptr;
  }
  BELUGA_CHECK(host.is_contiguous(), "upload: tensor must be contiguous, got ", host.describe());
  // From any thread (live EPLB's preparing thread, or the one stepping another rank): this backend's
  // device for the call, the caller's binding restored after it.
  const int dev = device_;
  int prev = dev;
  BELUGA_CUDA_CHECK(cudaGetDevice(&prev));
  BELUGA_CUDA_CHECK(cudaSetDevice(dev));
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, std::max<size_t>(host.nbytes(), 1));
  // Not on the backend's stream: the caller's thread may be another than the one stepping.
  if (err == cudaSuccess)
    err = cudaMemcpyAsync(p, host.data, host.nbytes(), cudaMemcpyHostToDevice, cudaStreamPerThread);
  if (err == cudaSuccess) err = cudaStreamSynchronize(cudaStreamPerThread);
  if (err != cudaSuccess && p) cudaFree(p);
  cudaSetDevice(prev);
  BELUGA_CUDA_CHECK(err);
  *out = Tensor::make(p, host.dtype, host.shape.data(), host.ndim, Device::kCuda);
  return std::shared_ptr<void>(p, [dev](void* q) {
    // Freed on its own device from whichever thread drops the last owner (cudaFree waits for the
    // device, so no queued step still reads it).
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = dev;
    cudaSetDevice(dev);
    cudaFree(q);
    cudaSetDevice(prev);
  });
}

void CudaOps::copy_to_host(const Tensor& src, void* dst) {
  Prof prof_scope(this, "copy_to_host");
  BELUGA_CHECK(src.is_contiguous(), "copy_to_host: tensor must be contiguous, got ", src.describe());
  BELUGA_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, S(stream_)));
  BELUGA_CUDA_CHECK(cudaStreamSynchronize(S(stream_)));
}

void CudaOps::copy_to_host_async(const Tensor& src, void* dst) {
  Prof prof_scope(this, "copy_to_host_async");
  BELUGA_CHECK(src.is_contiguous(), "copy_to_host_async: tensor must be contiguous, got ", src.describe());
  if (!host_copy_event_) {
    cudaEvent_t e = nullptr;
    BELUGA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    host_copy_event_ = e;
  }
  BELUGA_CUDA_CHECK(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, S(stream_)));
  BELUGA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(host_copy_event_), S(stream_)));
}

void CudaOps::wait_host_copies() {
  if (host_copy_event_) BELUGA_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(host_copy_event_)));
}

void CudaOps::copy_from_host(Tensor dst, const void* src) {
  Prof prof_scope(this, "copy_from_host");
  BELUGA_CHECK(dst.is_contiguous(), "copy_from_host: tensor must be contiguous, got ", dst.describe());
  // Pageable source: returns once the bytes are staged, so the caller may free `src` at once.
  BELUGA_CUDA_CHECK(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, S(stream_)));
}

// kv_block(s)_to_host / _from_host: kv_host_copy.cu.

void* CudaOps::host_alloc(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state of a failed allocation
    return nullptr;
  }
  return p;
}

void CudaOps::host_free(void* p) {
  if (p) cudaFreeHost(p);
}

void CudaOps::synchronize() {
  BELUGA_CUDA_CHECK(cudaStreamSynchronize(S(stream_)));
}

void CudaOps::bind_thread() {
  BELUGA_CUDA_CHECK(cudaSetDevice(device_));
}

int CudaOps::device_count() {
  int n = 0;
  BELUGA_CUDA_CHECK(cudaGetDeviceCount(&n));
  return n;
}

void CudaOps::copy_between(void* dst, const void* src, size_t bytes) {
  // Unified addressing: the runtime finds each side's memory; the calling thread's own stream keeps
  // the copy apart from the ranks' streams, and the wait makes it complete on return.
  BELUGA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamPerThread));
  BELUGA_CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
}

void CudaOps::begin_capture() {
  // Thread-local mode: other threads' CUDA calls (e.g. a loader) do not invalidate the capture.
  BELUGA_CUDA_CHECK(cudaStreamBeginCapture(S(stream_), cudaStreamCaptureModeThreadLocal));
}

int CudaOps::end_capture() {
  cudaGraph_t g = nullptr;
  BELUGA_CUDA_CHECK(cudaStreamEndCapture(S(stream_), &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  BELUGA_CUDA_CHECK(err);
  graphs_.push_back(exec);
  return int(graphs_.size()) - 1;
}

void CudaOps::replay(int graph) {
  BELUGA_CHECK(graph >= 0 && graph < int(graphs_.size()) && graphs_[size_t(graph)], "replay: no graph ",
               graph);
  if (replay_events_[0])
    BELUGA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(replay_events_[0]), S(stream_)));
  BELUGA_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graphs_[size_t(graph)]), S(stream_)));
  if (replay_events_[1]) {
    BELUGA_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(replay_events_[1]), S(stream_)));
    replay_timed_ = true;
  }
}

void CudaOps::set_replay_timing(bool on) {
  for (void*& e : replay_events_) {
    if (on && !e) {
      cudaEvent_t ev;
      BELUGA_CUDA_CHECK(cudaEventCreate(&ev));
      e = ev;
    } else if (!on && e) {
      BELUGA_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(e)));
      e = nullptr;
    }
  }
  replay_timed_ = false;
}

double CudaOps::last_replay_ms() {
  if (!replay_timed_) return 0.0;
  replay_timed_ = false;
  BELUGA_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(replay_events_[1])));
  float ms = 0.0f;
  BELUGA_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(replay_events_[0]),
                                         static_cast<cudaEvent_t>(replay_events_[1])));
  return ms;
}

void CudaOps::release_graph(int graph) {
  if (graph < 0 || graph >= int(graphs_.size()) || !graphs_[size_t(graph)]) return;
  cudaStreamSynchronize(S(stream_));
  cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(graphs_[size_t(graph)]));
  graphs_[size_t(graph)] = nullptr;
}

void CudaOps::fill_uniform(Tensor t, uint64_t seed, float lo, float hi) {
  BELUGA_CHECK(t.is_contiguous(), "fill_uniform: tensor must be contiguous");
  const int64_t n = t.numel();
  if (t.dtype == DType::kF32)
    launch(fill_uniform_kernel<float>, grid_for(n), 256, 0, S(stream_), t.ptr<float>(), n, seed, lo, hi);
  else if (t.dtype == DType::kBF16)
    launch(fill_uniform_kernel<bf16>, grid_for(n), 256, 0, S(stream_), t.ptr<bf16>(), n, seed, lo, hi);
  else
    fail("fill_uniform: F32 or BF16 only, got ", t.describe());
  BELUGA_LAUNCH_CHECK();
}

// ---------------------------------------------------------------------------------------------
void CudaOps::embedding(Tensor out, const Tensor& table, const Tensor& ids) {
  Prof prof_scope(this, "embedding");
  check_bf16_rows(out, "embedding output");
  const int R = int(ids.numel()), D = int(table.shape[1]);
  if (R == 0) return;
  if (table.dtype == DType::kBF16)
    launch(gather_kernel<bf16>, grid_for(int64_t(R) * D), 256, 0, S(stream_), out.ptr<bf16>(), out.stride[0],
           table.ptr<const bf16>(), table.stride[0], ids.ptr<const int32_t>(), R, D);
  else
    launch(gather_kernel<float>, grid_for(int64_t(R) * D), 256, 0, S(stream_), out.ptr<bf16>(), out.stride[0],
           table.ptr<const float>(), table.stride[0], ids.ptr<const int32_t>(), R, D);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::gather_rows(Tensor out, const Tensor& x, const Tensor& rows) {
  Prof prof_scope(this, "gather_rows");
  check_bf16_rows(out, "gather_rows output");
  check_bf16_rows(x, "gather_rows input");
  const int R = int(rows.numel()), D = int(x.shape[1]);
  if (R == 0) return;
  if (rows16(D, {out.stride[0], x.stride[0]}, {out.data, x.data}))
    launch(gather_rows8_kernel, grid_for(int64_t(R) * D / 8), 256, 0, S(stream_), out.ptr<bf16>(),
           out.stride[0], x.ptr<const bf16>(), x.stride[0], rows.ptr<const int32_t>(), R, D);
  else
    launch(gather_kernel<bf16>, grid_for(int64_t(R) * D), 256, 0, S(stream_), out.ptr<bf16>(), out.stride[0],
           x.ptr<const bf16>(), x.stride[0], rows.ptr<const int32_t>(), R, D);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::gather_ids(Tensor out, const Tensor& ids, const Tensor& rows) {
  Prof prof_scope(this, "gather_ids");
  BELUGA_CHECK(out.dtype == DType::kI32 && ids.dtype == DType::kI32 && rows.dtype == DType::kI32 &&
                   out.is_contiguous() && ids.is_contiguous() && rows.is_contiguous() &&
                   out.numel() == rows.numel(),
               "gather_ids: out I32 [R], ids I32 [N], rows I32 [R]");
  const int R = int(rows.numel());
  if (R == 0) return;
  launch(gather_ids_kernel, grid_for(R), 256, 0, S(stream_), out.ptr<int32_t>(), ids.ptr<const int32_t>(),
         rows.ptr<const int32_t>(), R);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::rmsnorm(Tensor out, const Tensor& x, const Tensor& w, float eps) {
  normalize({x, Tensor{}, w, out, eps, Tensor{}});
}

void CudaOps::add_rmsnorm(Tensor residual, const Tensor& x, Tensor out, const Tensor& w, float eps) {
  normalize({residual, x, w, out, eps, residual});
}

void CudaOps::normalize(const NormedInput& in) {
  Prof prof_scope(this, in.delta.empty() ? "rmsnorm" : "add_rmsnorm");
  check_bf16_rows(in.out, "rmsnorm output");
  check_bf16_rows(in.residual, "rmsnorm input");
  const bool add = !in.delta.empty();
  const Tensor& ro = in.residual_out.empty() ? in.residual : in.residual_out;
  if (add) {
    check_bf16_rows(in.delta, "add_rmsnorm delta");
    check_bf16_rows(ro, "add_rmsnorm residual output");
  }
  const int R = int(in.residual.shape[0]), D = int(in.residual.shape[1]);
  BELUGA_CHECK(in.w.numel() == D && in.out.shape[0] == R && in.out.shape[1] == D &&
                   (!add || (in.delta.shape == in.residual.shape && ro.shape == in.residual.shape)),
               "rmsnorm: shapes");
  if (R == 0) return;
  auto vec_rows = [](const Tensor& t) { return t.stride[0] % 8 == 0 && aligned16(t.data); };
  const bool vectorized = D % 8 == 0 && vec_rows(in.residual) && vec_rows(in.out) && aligned16(in.w.data) &&
                          (!add || (vec_rows(in.delta) && vec_rows(ro)));
  const NormArgs n = make_norm_args(in);
  launch(rmsnorm_kernel, R, kNormThreads, 0, S(stream_), n, vectorized);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::add(Tensor out, const Tensor& a, const Tensor& b) {
  Prof prof_scope(this, "add");
  check_bf16_rows(out, "add output");
  check_bf16_rows(a, "add input");
  check_bf16_rows(b, "add input");
  const int R = int(a.shape[0]), D = int(a.shape[1]);
  if (R == 0) return;
  launch(add_kernel, grid_for(int64_t(R) * D), 256, 0, S(stream_), out.ptr<bf16>(), out.stride[0],
         a.ptr<const bf16>(), a.stride[0], b.ptr<const bf16>(), b.stride[0], R, D);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::copy(Tensor out, const Tensor& x) {
  Prof prof_scope(this, "copy");
  BELUGA_CHECK(out.ndim == x.ndim && x.ndim >= 1 && x.ndim <= 3, "copy: ", x.describe(), " -> ",
               out.describe());
  for (int d = 0; d < x.ndim; ++d) BELUGA_CHECK(out.shape[d] == x.shape[d], "copy: shapes differ");
  // As [n0, n1, n2] with strides; missing leading dims have extent 1.
  int64_t n[3] = {1, 1, 1}, so[3] = {0, 0, 0}, sx[3] = {0, 0, 0};
  for (int d = 0; d < x.ndim; ++d) {
    const int k = 3 - x.ndim + d;
    n[k] = x.shape[d];
    so[k] = out.stride[d];
    sx[k] = x.stride[d];
  }
  const int64_t total = n[0] * n[1] * n[2];
  if (total == 0) return;
  const int g = grid_for(total);
  cudaStream_t st = S(stream_);
  if (out.dtype == DType::kI32 || x.dtype == DType::kI32) {  // ids: copied as they are
    BELUGA_CHECK(out.dtype == x.dtype && out.is_contiguous() && x.is_contiguous(),
                 "copy: I32 only to I32, contiguous");
    BELUGA_CUDA_CHECK(cudaMemcpyAsync(out.data, x.data, x.nbytes(), cudaMemcpyDeviceToDevice, st));
    return;
  }
  const bool ob = out.dtype == DType::kBF16, xb = x.dtype == DType::kBF16;
  BELUGA_CHECK((ob || out.dtype == DType::kF32) && (xb || x.dtype == DType::kF32), "copy: BF16/F32 only");
  if (ob && xb)
    launch(copy_kernel<bf16, bf16>, g, 256, 0, st, out.ptr<bf16>(), so[0], so[1], so[2], x.ptr<const bf16>(),
           sx[0], sx[1], sx[2], n[1], n[2], total);
  else if (ob)
    launch(copy_kernel<bf16, float>, g, 256, 0, st, out.ptr<bf16>(), so[0], so[1], so[2],
           x.ptr<const float>(), sx[0], sx[1], sx[2], n[1], n[2], total);
  else if (xb)
    launch(copy_kernel<float, bf16>, g, 256, 0, st, out.ptr<float>(), so[0], so[1], so[2],
           x.ptr<const bf16>(), sx[0], sx[1], sx[2], n[1], n[2], total);
  else
    launch(copy_kernel<float, float>, g, 256, 0, st, out.ptr<float>(), so[0], so[1], so[2],
           x.ptr<const float>(), sx[0], sx[1], sx[2], n[1], n[2], total);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::silu_mul(Tensor out, const Tensor& gate_up) {
  Prof prof_scope(this, "silu_mul");
  silu_mul_on(out, gate_up, stream_);
}

void CudaOps::silu_mul_on(Tensor out, const Tensor& gate_up, void* stream) {
  check_bf16_rows(out, "silu_mul output");
  check_bf16_rows(gate_up, "silu_mul input");
  const int R = int(out.shape[0]), I = int(out.shape[1]);
  BELUGA_CHECK(gate_up.shape[1] == 2 * I, "silu_mul: shapes");
  if (R == 0) return;
  if (rows16(I, {out.stride[0], gate_up.stride[0]}, {out.data, gate_up.data}))
    launch(silu_mul8_kernel, grid_for(int64_t(R) * I / 8), 256, 0, S(stream), out.ptr<bf16>(), out.stride[0],
           gate_up.ptr<const bf16>(), gate_up.stride[0], R, I);
  else
    launch(silu_mul_kernel, grid_for(int64_t(R) * I), 256, 0, S(stream), out.ptr<bf16>(), out.stride[0],
           gate_up.ptr<const bf16>(), gate_up.stride[0], R, I);
  BELUGA_LAUNCH_CHECK();
}

void CudaOps::rope(Tensor x, const Tensor& positions, const RopeTable& tab) {
  Prof prof_scope(this, "rope");
  BELUGA_CHECK(x.dtype == DType::kBF16 && x.ndim == 3 && x.stride[2] == 1 && x.shape[2] >= tab.rotary_dim,
               "rope: x must be BF16 [T, H, dim] with unit last stride, got ", x.describe());
  const int T = int(x.shape[0]), H = int(x.shape[1]), half = tab.rotary_dim / 2;
  if (T == 0) return;
  launch(rope_kernel, grid_for(int64_t(T) * H * half), 256, 0, S(stream_), x.ptr<bf16>(), x.stride[0],
         x.stride[1], T, H, half, positions.ptr<const int32_t>(), tab.cos.ptr<const float>(),
         tab.sin.ptr<const float>(), tab.interleaved);
  BELUGA_LAUNCH_CHECK();
}

}  // namespace beluga
