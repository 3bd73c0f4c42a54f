// NcclCommunicator: one process (or thread) per GPU, the group joined through ncclCommInitRank.
// Rank 0 makes the NCCL unique id and writes it to `id_file` (atomically: a temporary file, then a
// rename); the other ranks poll for the file (a shared filesystem or one host). Collectives are
// queued on `stream` (a cudaStream_t: the CUDA backend's, CudaOps::stream()), so they are ordered
// with the backend's kernels as the Communicator contract asks; barrier() waits for the stream.
// all_to_all_v is a group of ncclSend/ncclRecv pairs (NCCL has no all-to-all-v of its own).
// Compiled only with the CUDA backend.
#pragma once

#include <string>

#include "parallel/communicator.h"

struct ncclComm;

namespace beluga {

class NcclCommunicator final : public Communicator {
 public:
  // Joins the group of `size` ranks as `rank` on CUDA device `device`; waits at most
  // `timeout_s` for rank 0's id file.
  NcclCommunicator(int rank, int size, int device, const std::string& id_file, void* stream,
                   double timeout_s = 120);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes) override;
  using Communicator::all_to_all_v;
  void all_gather(const void* send, void* recv, size_t bytes) override;
  void all_reduce_sum(float* data, size_t n) override;
  void barrier() override;
  void abort() override;

 private:
  int rank_, size_, device_;
  void* stream_;
  ncclComm* comm_ = nullptr;
  float* barrier_buf_ = nullptr;  // one device float that barrier() all-reduces
};

}  // namespace beluga
