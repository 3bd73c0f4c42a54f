#include "parallel/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <thread>

#include "util/error.h"
#include "util/file.h"

namespace beluga {

namespace {

void check_nccl(ncclResult_t r, const char* what) {
  BELUGA_CHECK(r == ncclSuccess, what, ": ", ncclGetErrorString(r));
}

void check_cuda(cudaError_t r, const char* what) {
  BELUGA_CHECK(r == cudaSuccess, what, ": ", cudaGetErrorString(r));
}

cudaStream_t as_stream(void* s) {
  return static_cast<cudaStream_t>(s);
}

void check_live(const ncclComm* c) {
  BELUGA_CHECK(c != nullptr, "communicator: the group was aborted by a failed rank");
}

}  // namespace

NcclCommunicator::NcclCommunicator(int rank, int size, int device, const std::string& id_file, void* stream,
                                   double timeout_s)
    : rank_(rank), size_(size), device_(device), stream_(stream) {
  BELUGA_CHECK(size >= 1 && rank >= 0 && rank < size, "NcclCommunicator: rank ", rank, " of ", size);
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id;
  if (rank == 0) {
    check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    const std::string tmp = id_file + ".tmp";
    write_file(tmp, std::string(id.internal, sizeof(id.internal)));
    BELUGA_CHECK(std::rename(tmp.c_str(), id_file.c_str()) == 0, "cannot rename ", tmp, " to ", id_file);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!file_exists(id_file)) {
      BELUGA_CHECK(std::chrono::steady_clock::now() < deadline, "NcclCommunicator: rank ", rank,
                   " found no id file ", id_file, " from rank 0 after ", timeout_s, " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const std::string bytes = read_file(id_file);
    BELUGA_CHECK(bytes.size() == sizeof(id.internal), id_file, ": not an NCCL unique id");
    std::copy(bytes.begin(), bytes.end(), id.internal);
  }
  check_nccl(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&barrier_buf_), sizeof(float)), "cudaMalloc");
}

NcclCommunicator::~NcclCommunicator() {
  if (barrier_buf_) cudaFree(barrier_buf_);
  if (comm_) ncclCommDestroy(comm_);
}

void NcclCommunicator::all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                                    std::span<const size_t> recv_bytes) {
  BELUGA_CHECK(int(send_bytes.size()) == size_ && int(recv_bytes.size()) == size_,
               "all_to_all_v: counts for ", size_, " ranks expected");
  check_live(comm_);
  const auto* s = static_cast<const char*>(send);
  auto* r = static_cast<char*>(recv);
  check_nccl(ncclGroupStart(), "ncclGroupStart");
  for (int p = 0; p < size_; ++p) {
    if (send_bytes[size_t(p)])
      check_nccl(ncclSend(s, send_bytes[size_t(p)], ncclUint8, p, comm_, as_stream(stream_)), "ncclSend");
    if (recv_bytes[size_t(p)])
      check_nccl(ncclRecv(r, recv_bytes[size_t(p)], ncclUint8, p, comm_, as_stream(stream_)), "ncclRecv");
    s += send_bytes[size_t(p)];
    r += recv_bytes[size_t(p)];
  }
  check_nccl(ncclGroupEnd(), "ncclGroupEnd");
}

void NcclCommunicator::all_gather(const void* send, void* recv, size_t bytes) {
  check_live(comm_);
  check_nccl(ncclAllGather(send, recv, bytes, ncclUint8, comm_, as_stream(stream_)), "ncclAllGather");
}

void NcclCommunicator::all_reduce_sum(float* data, size_t n) {
  check_live(comm_);
  check_nccl(ncclAllReduce(data, data, n, ncclFloat, ncclSum, comm_, as_stream(stream_)), "ncclAllReduce");
}

void NcclCommunicator::barrier() {
  all_reduce_sum(barrier_buf_, 1);
  check_cuda(cudaStreamSynchronize(as_stream(stream_)), "cudaStreamSynchronize");
}

void NcclCommunicator::abort() {
  if (comm_) ncclCommAbort(comm_);
  comm_ = nullptr;
}

}  // namespace beluga
