// KvHostCopier: a step's KV block copies between the device cache and host images (Ops::
// kv_blocks_to_host / kv_blocks_from_host on CUDA). One copy per layer and block (27 per DeepSeek
// V2-Lite block of 73 KiB slices) ran at 4-5 GB/s, bound by the cost of each small copy. Here a step
// moves its blocks in batches: to the host, one gather kernel reads every layer's slice of every
// block into a device staging buffer laid out as the host images (block after block, each layer after
// layer), then one DMA per run of adjacent host images (a host tier's slots are often consecutive)
// copies them out whole; from the host, the same in reverse (DMAs into staging, one scatter kernel).
// Host memory may be pinned (Ops::host_alloc: the DMAs run at the link's rate and asynchronously) or
// pageable (correct, slower). All work is enqueued on the given stream; the host memory must stay as
// it is until the stream is synchronised. Not thread-safe (one per CudaOps, used from its stream's
// thread). No CUDA types here, so host code can include it.
#pragma once

#include <cstddef>
#include <span>

#include "backend/ops.h"

namespace beluga::cuda {

class KvHostCopier {
 public:
  static constexpr int kMaxLayers = 128;             // per cache (DeepSeek V3: 61)
  static constexpr int kMaxBatchBlocks = 256;        // blocks per kernel launch
  static constexpr size_t kStagingBytes = 64 << 20;  // a batch's staging (at least one block)

  KvHostCopier() = default;
  ~KvHostCopier();
  KvHostCopier(const KvHostCopier&) = delete;
  KvHostCopier& operator=(const KvHostCopier&) = delete;

  // `layers`: each a contiguous cache whose dim 0 is the block index. `stream`: a cudaStream_t.
  void to_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies, void* stream);
  void from_host(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies, void* stream);

 private:
  void run(std::span<const Tensor> layers, std::span<const KvBlockCopy> copies, void* stream, bool to_host);
  void reserve(size_t bytes, void* stream);  // staging of at least `bytes`

  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
};

}  // namespace beluga::cuda
