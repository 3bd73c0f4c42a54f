// LocalCommunicator: the ranks of a group are threads of one process over shared memory (CPU
// expert parallelism, and tests of the parallel code without GPUs). LocalGroup holds the shared
// state; communicator(r) is rank r's handle, used by one thread. Each collective posts the rank's
// buffers, waits for all ranks, copies what this rank receives from the peers' buffers (pull), and
// waits again so no rank reuses a buffer a peer still reads. Sums run in rank order, so every rank
// gets the same bits on every run. Buffers are host memory unless a LocalTransport says how to copy
// (thread ranks on GPUs: copies that reach device memory, and each rank's queued work finished before
// its buffers are read).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "parallel/communicator.h"

namespace beluga {

// How a group's buffers move. `copy` (null: memcpy) copies between any two ranks' buffers or host
// memory and returns once the bytes are there; ready[r] (empty: none) returns once rank r's queued
// work has written its buffers (CudaOps::synchronize), called before each of its collectives.
struct LocalTransport {
  std::function<void(void* dst, const void* src, size_t bytes)> copy;
  std::vector<std::function<void()>> ready;
};

class LocalGroup {
 public:
  explicit LocalGroup(int size, LocalTransport transport = {});
  ~LocalGroup();
  int size() const { return size_; }
  // Rank r's communicator (owned by the group; one thread uses it).
  Communicator& communicator(int r);
  // The rank that aborted the group first (the failed one; the others' calls threw because of it),
  // or -1 while the group is whole. Thread-safe.
  int failed_rank() const;

 private:
  friend class LocalCommunicator;
  // What a rank posts for the collective in flight.
  struct Post {
    const void* send = nullptr;
    void* recv = nullptr;
    const size_t* send_bytes = nullptr;  // all_to_all_v: size() counts
    size_t bytes = 0;                    // all_gather, all_reduce_sum
  };
  // Waits until every rank has arrived; throws when the group was aborted.
  void wait_all();
  void abort(int rank);
  void copy(void* dst, const void* src, size_t bytes) const;

  int size_;
  LocalTransport transport_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool aborted_ = false;
  int failed_rank_ = -1;
  std::vector<Post> posts_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace beluga
