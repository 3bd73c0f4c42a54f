#include "parallel/healthy_group.h"

#include <algorithm>

namespace beluga {

int healthy_group_size(int healthy_ranks, int routed_experts, bool even_split) {
  if (healthy_ranks < 1) return 0;
  for (int n = std::min(healthy_ranks, std::max(routed_experts, 1)); n > 1; --n)
    if (!even_split || routed_experts % n == 0) return n;
  return 1;
}

int healthy_tensor_group_size(int healthy_ranks, std::initializer_list<int64_t> split_dims) {
  if (healthy_ranks < 1) return 0;
  for (int n = healthy_ranks; n > 1; --n) {
    bool divides = true;
    for (int64_t d : split_dims) divides = divides && d % n == 0;
    if (divides) return n;
  }
  return 1;
}

}  // namespace beluga
