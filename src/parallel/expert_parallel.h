// The expert-parallel MoE feed-forward of one rank: the rank routes its own tokens, sends each
// (token, expert) pair's row to the rank holding that expert's slot (ExpertSharding::route), runs
// its own experts on the rows it receives with the backend's moe_experts, and sends the weighted
// results back; each token sums its k results in its own routing order, then adds the shared
// expert (run locally), so the output does not depend on the ranks' timing. Every rank of the
// group calls forward() for the same layer at the same time, with zero tokens too.
// Equals Ops::moe over all ranks' tokens up to float rounding: the routed products are weighted on
// the expert's rank and summed with add() (Ops::moe fuses the two), and the GEMMs see other row
// counts.
#pragma once

#include <cstdint>
#include <span>

#include "backend/ops.h"
#include "parallel/communicator.h"
#include "parallel/expert_load.h"
#include "parallel/shard.h"

namespace beluga {

// One MoE layer as a rank holds it: the whole router, the experts of its own slots (in slot order:
// ExpertSharding::local_experts) and the shared expert (null: none). A layer may carry its own slot
// map (`sharding`: live EPLB gives each layer one; null: the one the ExpertParallelMoe was made
// with; same ranks either way) and a window that counts the routing this rank computes (`load`,
// as layer `load_layer`: EPLB's statistics).
struct ExpertParallelLayer {
  const Weight& router;
  const Tensor& bias;
  const RouterParams& params;
  std::span<const ExpertWeights> local_experts;
  const ExpertWeights* shared;
  const ExpertSharding* sharding = nullptr;
  parallel::ExpertLoadWindow* load = nullptr;
  int load_layer = 0;
};

class ExpertParallelMoe {
 public:
  // `ops` is this rank's backend; `comm` and `sharding` describe the group (same ranks).
  ExpertParallelMoe(Ops& ops, Communicator& comm, const ExpertSharding& sharding);

  // out [T, D] for this rank's T tokens (the normalized input in.out, formed here as Ops::moe does).
  void forward(Tensor out, const NormedInput& in, const ExpertParallelLayer& m);
  // The same layer when every rank steps the same tokens (attention replicated, not data
  // parallel): in and out hold all T tokens on every rank; rank r routes and dispatches the rows
  // [T r / N, T (r + 1) / N), then every rank gets all ranks' rows of out (one more exchange).
  void forward_replicated(Tensor out, const NormedInput& in, const ExpertParallelLayer& m);

  // Bytes this rank has sent to other ranks (token rows, slot ids, weights and results), and those
  // it kept (rows for its own experts), over all forward() calls.
  struct Traffic {
    uint64_t sent_bytes = 0, local_bytes = 0;
    uint64_t dispatched_rows = 0;  // (token, expert) pairs routed by this rank
    uint64_t received_rows = 0;    // (token, expert) pairs this rank's experts computed: its load
  };
  const Traffic& traffic() const { return traffic_; }

 private:
  // Dispatch, the local experts and combine for the tokens x (normalized) routed to d_ids / d_w.
  void routed(Tensor out, const Tensor& x, const Tensor& d_ids, const Tensor& d_w,
              const ExpertParallelLayer& m);
  Ops& ops_;
  Communicator& comm_;
  const ExpertSharding& sharding_;
  Traffic traffic_;
};

}  // namespace beluga
