// The machine's own limits, measured on this backend's stream for the benchmarks' peer columns: the
// device-to-device copy rate and a large BF16 GEMM's rate (the stream-chain floor is in
// cuda_stream_chain.cu).
#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga {

using namespace cuda;

double CudaOps::measure_copy_bandwidth() {
  const size_t bytes = size_t(4) << 30;
  void *a = nullptr, *b = nullptr;
  BELUGA_CUDA_CHECK(cudaMalloc(&a, bytes));
  BELUGA_CUDA_CHECK(cudaMalloc(&b, bytes));
  BELUGA_CUDA_CHECK(cudaMemsetAsync(a, 1, bytes, S(stream_)));
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 8; ++i) {
    cudaEventRecord(e0, S(stream_));
    BELUGA_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, S(stream_)));
    cudaEventRecord(e1, S(stream_));
    BELUGA_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 2) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * double(bytes) / (ms[ms.size() / 2] * 1e-3);
}

double CudaOps::measure_gemm_peak() {
  const int n = 8192;
  Tensor a = alloc_persistent(DType::kBF16, {n, n}), b = alloc_persistent(DType::kBF16, {n, n}),
         c = alloc_persistent(DType::kBF16, {n, n});
  fill_uniform(a, 1, -1.0f, 1.0f);
  fill_uniform(b, 2, -1.0f, 1.0f);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0, S(stream_));
    gemm_bf16(c, a, b);
    cudaEventRecord(e1, S(stream_));
    BELUGA_CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return 2.0 * double(n) * n * n / (ms[ms.size() / 2] * 1e-3);
}

}  // namespace beluga
