#include "parallel/local_communicator.h"

#include <cstring>
#include <string>

#include "util/error.h"

namespace beluga {

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(LocalGroup& g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_.size_; }
  using Communicator::all_to_all_v;

  void all_to_all_v(const void* send, std::span<const size_t> send_bytes, void* recv,
                    std::span<const size_t> recv_bytes) override {
    const int n = g_.size_;
    BELUGA_CHECK(int(send_bytes.size()) == n && int(recv_bytes.size()) == n, "all_to_all_v: counts for ", n,
                 " ranks expected");
    post({send, recv, send_bytes.data(), 0});
    // Rank p's block for this rank starts after its blocks for ranks below this one.
    std::string error;
    auto* out = static_cast<unsigned char*>(recv);
    for (int p = 0; p < n; ++p) {
      const LocalGroup::Post& src = g_.posts_[size_t(p)];
      size_t off = 0;
      for (int q = 0; q < rank_; ++q) off += src.send_bytes[q];
      const size_t len = src.send_bytes[rank_];
      if (len != recv_bytes[size_t(p)]) {
        error = "all_to_all_v: rank " + std::to_string(p) + " sends " + std::to_string(len) +
                " bytes to rank " + std::to_string(rank_) + ", which expects " +
                std::to_string(recv_bytes[size_t(p)]);
        break;
      }
      if (len) g_.copy(out, static_cast<const unsigned char*>(src.send) + off, len);
      out += len;
    }
    g_.wait_all();  // peers may reuse their send buffers only after everyone has read them
    if (!error.empty()) fail(error);
  }

  void all_gather(const void* send, void* recv, size_t bytes) override {
    post({send, recv, nullptr, bytes});
    std::string error;
    for (int p = 0; p < g_.size_; ++p) {
      const LocalGroup::Post& src = g_.posts_[size_t(p)];
      if (src.bytes != bytes)
        error = "all_gather: ranks disagree on the size";
      else if (bytes)
        g_.copy(static_cast<unsigned char*>(recv) + size_t(p) * bytes, src.send, bytes);
    }
    g_.wait_all();
    if (!error.empty()) fail(error);
  }

  void all_reduce_sum(float* data, size_t n) override {
    post({data, nullptr, nullptr, n});
    std::string error;
    // Reused: tensor parallelism sums twice a layer.
    sum_.assign(n, 0.0f);
    std::vector<float>& sum = sum_;
    std::vector<float>& staged = staged_;
    staged.resize(g_.transport_.copy ? n : 0);
    for (int p = 0; p < g_.size_; ++p) {
      const LocalGroup::Post& src = g_.posts_[size_t(p)];
      if (src.bytes != n) {
        error = "all_reduce_sum: ranks disagree on the size";
        break;
      }
      const auto* x = static_cast<const float*>(src.send);
      if (!staged.empty()) {  // device memory: read through the transport
        g_.copy(staged.data(), x, n * sizeof(float));
        x = staged.data();
      }
      for (size_t i = 0; i < n; ++i) sum[i] += x[i];
    }
    g_.wait_all();  // everyone has read every rank's data: now it may be overwritten
    if (!error.empty()) fail(error);
    if (n) g_.copy(data, sum.data(), n * sizeof(float));
  }

  void barrier() override {
    make_ready();
    g_.wait_all();
  }
  void abort() override { g_.abort(rank_); }

 private:
  // Publishes this rank's buffers and waits until every rank has published its own.
  void post(const LocalGroup::Post& p) {
    make_ready();  // this rank's buffers written before a peer reads them
    g_.posts_[size_t(rank_)] = p;
    g_.wait_all();
  }
  void make_ready() const {
    const auto& ready = g_.transport_.ready;
    if (size_t(rank_) < ready.size() && ready[size_t(rank_)]) ready[size_t(rank_)]();
  }
  LocalGroup& g_;
  int rank_;
  std::vector<float> sum_, staged_;  // all_reduce_sum's
};

LocalGroup::LocalGroup(int size, LocalTransport transport)
    : size_(size), transport_(std::move(transport)), posts_(size_t(size)) {
  BELUGA_CHECK(size >= 1, "LocalGroup: size must be at least 1, got ", size);
  for (int r = 0; r < size; ++r) comms_.push_back(std::make_unique<LocalCommunicator>(*this, r));
}

LocalGroup::~LocalGroup() = default;

Communicator& LocalGroup::communicator(int r) {
  BELUGA_CHECK(r >= 0 && r < size_, "LocalGroup: no rank ", r, " in a group of ", size_);
  return *comms_[size_t(r)];
}

void LocalGroup::copy(void* dst, const void* src, size_t bytes) const {
  if (transport_.copy)
    transport_.copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

int LocalGroup::failed_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_rank_;
}

void LocalGroup::wait_all() {
  std::unique_lock<std::mutex> lock(mu_);
  BELUGA_CHECK(!aborted_, "communicator: the group was aborted by a failed rank");
  const uint64_t gen = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen || aborted_; });
  BELUGA_CHECK(generation_ != gen, "communicator: the group was aborted by a failed rank");
}

void LocalGroup::abort(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_) failed_rank_ = rank;
  aborted_ = true;
  cv_.notify_all();
}

}  // namespace beluga
