// The expert-parallel group an instance restarts with after ranks failed (DeepSeek: "the instance
// restarts with the EP size derived from the healthy GPUs"): the largest size not above the healthy
// ranks over which the routed experts split, each rank holding at least one; with EPLB the split
// must be even (the planner's slots per rank). 1 (one rank, every expert) is always possible.
// A tensor-parallel group restarts with the largest size not above the healthy ranks that divides
// every split dimension (heads, KV heads, intermediate size).
#pragma once

#include <cstdint>
#include <initializer_list>

namespace beluga {

// 0 when no rank is healthy (nothing to restart with).
int healthy_group_size(int healthy_ranks, int routed_experts, bool even_split);
int healthy_tensor_group_size(int healthy_ranks, std::initializer_list<int64_t> split_dims);

}  // namespace beluga
