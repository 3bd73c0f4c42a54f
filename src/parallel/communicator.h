// Communicator: one rank's handle on a group of ranks that exchange buffers (expert parallelism's
// token dispatch and combine). Buffers are in the memory of the rank's backend (host memory for the
// CPU; device memory for CUDA); counts and offsets are host values.
// Every rank of the group must make the same calls in the same order (collectives). Calls are
// ordered with the rank's backend ops: when a call returns, the next op on that backend may read the
// result (LocalCommunicator: the data is there; NCCL: the exchange is queued on the backend's stream).
// A rank that fails aborts the group (abort()): the calls of the other ranks then throw, not hang.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

namespace beluga {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // send holds size() blocks back to back, block p (send_bytes[p] bytes) going to rank p; recv gets
  // the blocks from ranks 0..size()-1 back to back, recv_bytes[p] from rank p. recv_bytes[p] must be
  // what rank p sends to this rank (exchange the counts first: all_gather). Counts may be zero.
  virtual void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                            std::span<const size_t> recv_bytes) = 0;
  // The same with counts in floats.
  void all_to_all_v(const float* send, std::span<const size_t> send_counts, float* recv,
                    std::span<const size_t> recv_counts);
  // recv [size() * bytes] = every rank's `bytes` bytes of send, in rank order.
  virtual void all_gather(const void* send, void* recv, size_t bytes) = 0;
  // data[i] = sum over ranks of data[i], the same on every rank.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  virtual void barrier() = 0;
  // Marks the group failed (this rank cannot go on): pending and later calls of every rank throw.
  virtual void abort() = 0;
};

}  // namespace beluga
