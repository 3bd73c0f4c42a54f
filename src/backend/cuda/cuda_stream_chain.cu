// The floor of a decode step's shape: its weight streams as dependent pure reads, with nothing to
// compute. A batch-1 step is a chain of a few hundred short streams (one per GEMV, 1-70 MB each) where
// each stage needs the previous one's output; the copy-rate floor counts all of its bytes as one
// stream. Two shapes are measured, each also with every stage's first loads issued before it waits: a
// kernel per stage (PDL, one CUDA graph), as the engine runs a step, and one persistent kernel with a
// grid barrier between stages. bench model prints them beside the measured step (bench/NOTES.md runs
// 122-124).
#include <algorithm>
#include <optional>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

namespace {

// Two blocks of 256 threads per SM with 16 16-byte loads in flight per thread: the fastest of the
// shapes measured for the chain (4 / 8 / 16 loads, 1 / 2 / 4 / 8 blocks per SM; bench/NOTES.md run
// 124): fewer blocks leave room for the next stage's blocks to be resident before the previous ends.
constexpr int kChainThreads = 256, kChainLoads = 16, kChainBlocksPerSm = 2;

// Thread t of the grid reads 16-byte chunks t, t + T, ... of [src, src + n16) in groups of
// kChainLoads issued together (consecutive threads, consecutive chunks), and sums their words (mod
// 2^32) into a value the caller publishes: the loads cannot be dropped, and the host can check that
// every chunk was read once. A group starts at `base`.
__device__ __forceinline__ void load_group(uint4 (&v)[kChainLoads], const uint4* src, int64_t n16,
                                           int64_t base, int64_t T) {
#pragma unroll
  for (int j = 0; j < kChainLoads; ++j)
    v[j] = base + j * T < n16 ? ld_stream(reinterpret_cast<const bf16*>(src + base + j * T)) : uint4{};
}

__device__ __forceinline__ unsigned fold(const uint4 (&v)[kChainLoads]) {
  unsigned acc = 0;
#pragma unroll
  for (int j = 0; j < kChainLoads; ++j) acc += v[j].x + v[j].y + v[j].z + v[j].w;
  return acc;
}

__device__ __forceinline__ unsigned stream_fold(const uint4* src, int64_t n16, int64_t base, int64_t T) {
  unsigned acc = 0;
  for (; base < n16; base += T * kChainLoads) {
    uint4 v[kChainLoads];
    load_group(v, src, n16, base, T);
    acc += fold(v);
  }
  return acc;
}

__device__ __forceinline__ unsigned block_sum(unsigned v) {
  __shared__ unsigned part[kChainThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  unsigned s = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < kChainThreads / 32; ++w) s += part[w];
  return s;
}

// One stage: waits for the previous stage (PDL), reads its result as a GEMV reads its input vector,
// streams its bytes, and adds the block's fold to the next result. kEarly: the first group of loads
// is issued before the wait (the weights do not depend on the previous stage).
template <bool kEarly>
__global__ void __launch_bounds__(kChainThreads)
    stream_stage_kernel(const uint4* src, int64_t n16, const unsigned* prev, unsigned* next) {
  const int64_t t = int64_t(blockIdx.x) * kChainThreads + threadIdx.x, T = int64_t(gridDim.x) * kChainThreads;
  uint4 v[kChainLoads];
  if constexpr (kEarly) load_group(v, src, n16, t, T);
  pdl_entry();
  const unsigned in = *reinterpret_cast<const volatile unsigned*>(prev);
  unsigned acc = 0;
  if constexpr (kEarly)
    acc = fold(v) + stream_fold(src, n16, t + T * kChainLoads, T);
  else
    acc = stream_fold(src, n16, t, T);
  const unsigned s = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(next, s + in);
}

// Every stage in one launch of co-resident blocks: stage i reads [off[i], off[i + 1]) chunks, then the
// grid meets at a barrier (a release add and an acquire spin on one counter, reset before the launch).
// kEarly: each thread's first group of stage i + 1 is loaded before barrier i.
template <bool kEarly>
__global__ void __launch_bounds__(kChainThreads)
    stream_persistent_kernel(const uint4* src, const int64_t* off, int stages, unsigned* counter,
                             unsigned* sink) {
  pdl_entry();
  const int64_t t = int64_t(blockIdx.x) * kChainThreads + threadIdx.x, T = int64_t(gridDim.x) * kChainThreads;
  unsigned total = 0;
  uint4 v[kChainLoads];
  for (int i = 0; i < stages; ++i) {
    const uint4* p = src + off[i];
    const int64_t n16 = off[i + 1] - off[i];
    unsigned acc;
    if (kEarly && i > 0)
      acc = fold(v) + stream_fold(p, n16, t + T * kChainLoads, T);
    else
      acc = stream_fold(p, n16, t, T);
    if (kEarly && i + 1 < stages) load_group(v, src + off[i + 1], off[i + 2] - off[i + 1], t, T);
    const unsigned s = block_sum(acc);
    if (threadIdx.x == 0) {
      total += s;
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(counter) : "memory");
      const unsigned target = unsigned(i + 1) * gridDim.x;
      unsigned seen = 0;
      do {
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(seen) : "l"(counter) : "memory");
      } while (seen < target);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(sink, total);
}

}  // namespace

std::optional<CudaOps::StreamChainResult> CudaOps::measure_stream_chain(
    const std::vector<int64_t>& stage_bytes, StreamChain shape) {
  BELUGA_CHECK(!stage_bytes.empty(), "measure_stream_chain: no stages");
  std::vector<int64_t> off(stage_bytes.size() + 1, 0);
  for (size_t i = 0; i < stage_bytes.size(); ++i) off[i + 1] = off[i] + ceil_div(stage_bytes[i], int64_t(16));
  const int stages = int(stage_bytes.size());
  // Distinct bytes for every stage, as a step's weights are: nothing is served from L2 twice.
  size_t free_bytes = 0, total_bytes = 0;
  BELUGA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (size_t(off.back()) * 16 + (size_t(256) << 20) > free_bytes) return std::nullopt;
  void* buf = nullptr;
  BELUGA_CUDA_CHECK(cudaMalloc(&buf, size_t(off.back()) * 16));
  void* words = nullptr;  // results of the stages (kernels) or counter + sink (persistent)
  BELUGA_CUDA_CHECK(cudaMalloc(&words, sizeof(unsigned) * size_t(stages + 2)));
  int64_t* off_d = nullptr;
  BELUGA_CUDA_CHECK(cudaMalloc(&off_d, sizeof(int64_t) * off.size()));
  cudaStream_t st = S(stream_);

  BELUGA_CUDA_CHECK(
      cudaMemcpyAsync(off_d, off.data(), sizeof(int64_t) * off.size(), cudaMemcpyHostToDevice, st));
  const uint4* src = static_cast<const uint4*>(buf);
  unsigned* w = static_cast<unsigned*>(words);

  const bool early = shape == StreamChain::kKernelsEarly || shape == StreamChain::kPersistentEarly;
  const bool kernels = shape == StreamChain::kKernels || shape == StreamChain::kKernelsEarly;
  // The pass's final word (the last stage's result, or the persistent kernel's sink) from first
  // principles: every byte is kFill, so a chunk's four words sum to 4 * 0x5a5a5a5a (mod 2^32).
  constexpr int kFill = 0x5a;
  auto sum_of = [](int64_t n16) { return unsigned(uint64_t(n16) * 4u * 0x5a5a5a5au); };
  unsigned expected = 0;
  BELUGA_CUDA_CHECK(cudaMemsetAsync(buf, kFill, size_t(off.back()) * 16, st));
  BELUGA_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  BELUGA_CUDA_CHECK(cudaMemsetAsync(words, 0, sizeof(unsigned) * size_t(stages + 2), st));
  if (kernels) {
    // kChainBlocksPerSm blocks per SM, fewer for a short stream (one chunk per thread at least).
    auto kernel = early ? stream_stage_kernel<true> : stream_stage_kernel<false>;
    const int resident = sm_count_ * kChainBlocksPerSm;
    for (int i = 0; i < stages; ++i) {
      const int64_t n16 = off[i + 1] - off[i];
      const int grid = int(std::clamp<int64_t>(ceil_div(n16, int64_t(kChainThreads)), 1, resident));
      // Each of the grid's blocks adds its sum and the previous stage's result, which it read after
      // that stage ended.
      expected = expected * unsigned(grid) + sum_of(n16);
      launch(kernel, grid, kChainThreads, 0, st, src + off[i], n16,
             static_cast<const unsigned*>(i ? w + i - 1 : w + stages), w + i);
      BELUGA_LAUNCH_CHECK();
    }
  } else {
    auto kernel = early ? stream_persistent_kernel<true> : stream_persistent_kernel<false>;
    // The grid barrier needs every block resident at once.
    int fit = 0;
    BELUGA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, kChainThreads, 0));
    BELUGA_CHECK(fit >= kChainBlocksPerSm, "measure_stream_chain: ", fit, " persistent blocks fit per SM");
    launch(kernel, sm_count_ * kChainBlocksPerSm, kChainThreads, 0, st, src,
           static_cast<const int64_t*>(off_d), stages, w, w + 1);
    for (int i = 0; i < stages; ++i) expected += sum_of(off[i + 1] - off[i]);
    BELUGA_LAUNCH_CHECK();
  }
  cudaGraph_t g = nullptr;
  BELUGA_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  BELUGA_CUDA_CHECK(err);

  cudaEvent_t e0, e1;
  BELUGA_CUDA_CHECK(cudaEventCreate(&e0));
  BELUGA_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int rep = 0; rep < 12; ++rep) {
    BELUGA_CUDA_CHECK(cudaEventRecord(e0, st));
    BELUGA_CUDA_CHECK(cudaGraphLaunch(exec, st));
    BELUGA_CUDA_CHECK(cudaEventRecord(e1, st));
    BELUGA_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    BELUGA_CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (rep >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  StreamChainResult r{double(ms[ms.size() / 2]) * 1e-3, 0, expected};
  BELUGA_CUDA_CHECK(
      cudaMemcpy(&r.result, w + (kernels ? stages - 1 : 1), sizeof(unsigned), cudaMemcpyDeviceToHost));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaFree(off_d);
  cudaFree(words);
  cudaFree(buf);
  return r;
}

}  // namespace beluga
