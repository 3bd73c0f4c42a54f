// DeepSeek's expert-parallel load balancer (EPLB, github.com/deepseek-ai/EPLB), written from its
// description: given each MoE layer's load per logical expert (routed tokens over a window,
// expert_load.h) and `num_replicas` physical expert slots spread evenly over `num_gpus`, it picks which
// experts get redundant replicas and which GPU holds each replica so the heaviest GPU's load is low.
//   hierarchical (num_groups % num_nodes == 0; prefill, small EP): expert groups are packed onto nodes
//     (so group-limited routing stays inside a node), each node replicates its own experts into its
//     slots, then the node's replicas are packed onto its GPUs.
//   global (otherwise; decode, large EP): the same with one group and one node: replicas anywhere.
// Replicas of an expert are assumed to split its tokens evenly (expert_placement.h's choose()).
// Slot p lives on GPU p / (num_replicas / num_gpus). Ties break as the published code's do (stable
// descending sort, lowest index first), so its README example comes out identical (eplb_test.cc).
// One addition, `spread_replicas` (on by default; off is exactly the published code): two replicas of
// one expert on one GPU waste a slot (that GPU takes the expert's tokens for both). With it, packing
// replicas onto GPUs puts a replica into the lightest GPU with room that lacks its expert (the
// lightest with room when all with room hold it), then swaps remaining co-located replicas with
// another GPU's when neither GPU ends heavier than the heaviest GPU was. It changes nothing where the
// published code co-locates nothing (its README example included); it may raise the maximum a little
// (eplb_test.cc's global hand case; `beluga bench eplb` reports both).
#pragma once

#include <span>
#include <vector>

namespace beluga::parallel {

struct EplbShape {
  int num_replicas = 0;  // physical expert slots per layer (experts + redundant ones), a multiple of num_gpus
  int num_groups = 1;    // expert groups (V3: 8 groups of 32); must divide the expert count
  int num_nodes = 1;     // must divide num_gpus
  int num_gpus = 1;
};

enum class EplbPolicy { automatic, hierarchical, global };

struct EplbOptions {
  EplbPolicy policy = EplbPolicy::automatic;  // automatic: hierarchical when groups % nodes == 0
  bool spread_replicas = true;                // see the header comment; false: exactly the published code
};

// One layer's placement.
struct LayerPlan {
  std::vector<int> phy_to_log;               // [num_replicas]: the logical expert in each slot
  std::vector<int> replica_count;            // [experts]: slots holding each expert (>= 1)
  std::vector<std::vector<int>> log_to_phy;  // [experts][replica]: its slots, in replica order
};

struct EplbPlan {
  bool hierarchical = false;  // the policy that ran
  std::vector<LayerPlan> layers;
};

// loads: [layers][experts], non-negative. Throws beluga::Error on a shape that does not divide.
EplbPlan rebalance_experts(const std::vector<std::vector<double>>& loads, const EplbShape& shape,
                           const EplbOptions& options = {});

// The building blocks, for tests.
struct Packing {
  std::vector<int> pack;          // [items]: its pack
  std::vector<int> rank_in_pack;  // [items]: its position in the pack, in placement order
};
// Puts items.size() / num_packs items into each pack, heaviest first into the lightest pack with room.
// With `keys` (one per item), items of one key avoid sharing a pack as described above (spread_replicas).
Packing balanced_packing(std::span<const double> weights, int num_packs, std::span<const int> keys = {});

struct Replication {
  std::vector<int> phy_to_log;  // [num_phy]: slot i < experts holds expert i; later slots are the extras
  std::vector<int> rank;        // [num_phy]: which replica of its expert the slot is (0 = the first)
  std::vector<int> count;       // [experts]
};
// Starts with one replica per expert and gives each extra slot to the expert with the highest load per
// replica.
Replication replicate_experts(std::span<const double> weights, int num_phy);

// The GPUs' load under a plan (each replica taking load / replica_count), and max / mean over them.
std::vector<double> gpu_loads(const LayerPlan& plan, std::span<const double> load, int num_gpus);
double max_over_mean(std::span<const double> per_gpu);

}  // namespace beluga::parallel
