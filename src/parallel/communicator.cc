#include "parallel/communicator.h"

#include <vector>

namespace beluga {

void Communicator::all_to_all_v(const float* send, std::span<const size_t> send_counts, float* recv,
                                std::span<const size_t> recv_counts) {
  std::vector<size_t> sb(send_counts.begin(), send_counts.end()), rb(recv_counts.begin(), recv_counts.end());
  for (size_t& n : sb) n *= sizeof(float);
  for (size_t& n : rb) n *= sizeof(float);
  all_to_all_v(static_cast<const void*>(send), sb, static_cast<void*>(recv), rb);
}

}  // namespace beluga
