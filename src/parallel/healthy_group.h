// The expert-parallel group an instance restarts with after ranks failed (DeepSeek: "the instance
// restarts with the EP size derived from the healthy GPUs"): the largest size not above the healthy
// ranks over which the routed experts split, each rank holding at least one; with EPLB the split
// must be even (the planner's slots per rank). 1 (one rank, every expert) is always possible.
// (A tensor-parallel group: model.h, tensor_parallel_restart_size.)
#pragma once

namespace beluga {

// 0 when no rank is healthy (nothing to restart with).
int healthy_group_size(int healthy_ranks, int routed_experts, bool even_split);

}  // namespace beluga
