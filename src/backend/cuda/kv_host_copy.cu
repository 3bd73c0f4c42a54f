#include "backend/cuda/kv_host_copy.h"

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

namespace beluga::cuda {

namespace {

// A batch, passed by value as the kernel's parameter (2.6 KB, under the 4 KB limit).
struct CopyBatch {
  int layers = 0, n = 0;
  unsigned long long block_bytes = 0;
  char* base[KvHostCopier::kMaxLayers];
  unsigned int row_bytes[KvHostCopier::kMaxLayers];  // one block's slice of the layer
  int blocks[KvHostCopier::kMaxBatchBlocks];
};
static_assert(sizeof(CopyBatch) < 4096, "kernel parameters are limited to 4 KB");

// CTA (layer l, copy i) moves block blocks[i]'s slice of layer l between the cache and its place in
// the staging images: staging + i * block_bytes + (the slices of the layers before l).
__global__ void kv_stage_kernel(CopyBatch b, char* staging, bool gather) {
  pdl_entry();
  const int l = blockIdx.x, i = blockIdx.y;
  unsigned long long off = 0;
  for (int k = 0; k < l; ++k) off += b.row_bytes[k];
  char* cache = b.base[l] + (unsigned long long)b.blocks[i] * b.row_bytes[l];
  char* img = staging + (unsigned long long)i * b.block_bytes + off;
  const char* src = gather ? cache : img;
  char* dst = gather ? img : cache;
  const unsigned int n = b.row_bytes[l];
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | n) & 15) == 0) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (unsigned int k = threadIdx.x; k < n / 16; k += blockDim.x) d[k] = s[k];
  } else {
    for (unsigned int k = threadIdx.x; k < n; k += blockDim.x) dst[k] = src[k];
  }
}

}  // namespace

KvHostCopier::~KvHostCopier() {
  if (staging_) cudaFree(staging_);
}

void KvHostCopier::reserve(size_t bytes, void* stream) {
  if (bytes <= staging_bytes_) return;
  if (staging_) {
    BELUGA_CUDA_CHECK(cudaStreamSynchronize(S(stream)));  // the copies in flight still use it
    BELUGA_CUDA_CHECK(cudaFree(staging_));
    staging_ = nullptr;
    staging_bytes_ = 0;
  }
  BELUGA_CUDA_CHECK(cudaMalloc(&staging_, bytes));
  staging_bytes_ = bytes;
}

void KvHostCopier::to_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies,
                           void* stream) {
  run(layers, copies, stream, true);
}

void KvHostCopier::from_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies,
                             void* stream) {
  run(layers, copies, stream, false);
}

void KvHostCopier::run(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies, void* stream,
                       bool to_host) {
  if (copies.empty() || layers.empty()) return;
  BELUGA_CHECK(layers.size() <= size_t(kMaxLayers), "KV host copies: ", layers.size(), " layers, at most ",
               kMaxLayers);
  CopyBatch b;
  b.layers = int(layers.size());
  for (size_t l = 0; l < layers.size(); ++l) {
    const Tensor& t = layers[l];
    BELUGA_CHECK(t.is_contiguous() && t.shape[0] > 0, "KV host copies: cache must be contiguous, got ",
                 t.describe());
    const size_t row = t.nbytes() / size_t(t.shape[0]);
    BELUGA_CHECK(row < (size_t(1) << 32), "KV host copies: a block slice of ", row, " bytes");
    b.base[l] = static_cast<char*>(t.data);
    b.row_bytes[l] = unsigned(row);
    b.block_bytes += row;
  }
  const size_t block = size_t(b.block_bytes);
  const size_t per_batch = std::clamp<size_t>(kStagingBytes / block, 1, size_t(kMaxBatchBlocks));
  reserve(std::min(per_batch, copies.size()) * block, stream);
  char* staging = static_cast<char*>(staging_);
  const cudaStream_t st = S(stream);
  for (size_t first = 0; first < copies.size(); first += per_batch) {
    const size_t n = std::min(per_batch, copies.size() - first);
    b.n = int(n);
    for (size_t i = 0; i < n; ++i) {
      const int blk = copies[first + i].block;
      BELUGA_CHECK(blk >= 0 && blk < layers[0].shape[0], "KV host copies: block ", blk, " out of range");
      b.blocks[i] = blk;
    }
    if (!to_host) {  // host images -> staging, a DMA per run of adjacent images
      for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && copies[first + j].host == copies[first + j - 1].host + block) ++j;
        BELUGA_CUDA_CHECK(cudaMemcpyAsync(staging + i * block, copies[first + i].host, (j - i) * block,
                                          cudaMemcpyHostToDevice, st));
        i = j;
      }
    }
    launch(kv_stage_kernel, dim3(unsigned(b.layers), unsigned(n)), dim3(256), 0, st, b, staging, to_host);
    if (to_host) {
      for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && copies[first + j].host == copies[first + j - 1].host + block) ++j;
        BELUGA_CUDA_CHECK(cudaMemcpyAsync(copies[first + i].host, staging + i * block, (j - i) * block,
                                          cudaMemcpyDeviceToHost, st));
        i = j;
      }
    }
  }
}

}  // namespace beluga::cuda

namespace beluga {

void CudaOps::kv_block_to_host(std::span<const Tensor> layers, int block, void* dst) {
  const KvBlockCopy c{block, static_cast<std::byte*>(dst)};
  kv_blocks_to_host(layers, {&c, 1});
}

void CudaOps::kv_block_from_host(std::span<const Tensor> layers, int block, const void* src) {
  // The copier only reads host memory in this direction.
  const KvBlockCopy c{block, static_cast<std::byte*>(const_cast<void*>(src))};
  kv_blocks_from_host(layers, {&c, 1});
}

void CudaOps::kv_blocks_to_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies) {
  Prof prof_scope(this, "kv_blocks_to_host");
  kv_host_.to_host(layers, copies, stream_);
}

void CudaOps::kv_blocks_from_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies) {
  Prof prof_scope(this, "kv_blocks_from_host");
  kv_host_.from_host(layers, copies, stream_);
}

}  // namespace beluga
