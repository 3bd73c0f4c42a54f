#include "parallel/healthy_group.h"

#include <algorithm>

namespace beluga {

int healthy_group_size(int healthy_ranks, int routed_experts, bool even_split) {
  if (healthy_ranks < 1) return 0;
  for (int n = std::min(healthy_ranks, std::max(routed_experts, 1)); n > 1; --n)
    if (!even_split || routed_experts % n == 0) return n;
  return 1;
}

}  // namespace beluga
