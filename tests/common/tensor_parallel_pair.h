// A model split over CPU thread ranks by tensor parallelism (model.h: TensorParallelism), the way
// `beluga serve --tensor-parallel-size N` loads it: rank 0's model (`model`, which steps the group)
// and ranks 1.. as its step peers, each with one CPU thread. A DeepSeek model's routed experts split
// over the same ranks (contiguously).
#pragma once

#include <memory>
#include <optional>

#include "engine/thread_rank_peers.h"
#include "model/model.h"
#include "parallel/local_communicator.h"
#include "parallel/shard.h"

namespace beluga::test {

struct TensorParallelGroup {
  LocalGroup group;
  std::optional<ExpertSharding> sharding;
  CpuOps ops{CpuOptions{1}};
  std::unique_ptr<Model> model;
  std::unique_ptr<ThreadRankPeers> peers;
  TensorParallelGroup(const ModelConfig& cfg, WeightSource& w, int max_positions, int ranks = 2,
                      InjectedRankFault fault = {})
      : group(ranks) {
    if (cfg.is_mla()) sharding = ExpertSharding::contiguous(cfg.n_routed_experts, ranks);
    auto load = [&](int r, Ops& o) {
      const TensorParallelism tp{&group.communicator(r)};
      const ExpertParallelism ep{&group.communicator(r), sharding ? &*sharding : nullptr, true};
      return load_model(cfg, w, o, max_positions, sharding ? &ep : nullptr, &tp);
    };
    model = load(0, ops);
    peers = std::make_unique<ThreadRankPeers>(
        group, cpu_peer_ops(ranks, CpuOptions{1}), load,
        cfg.is_mla() ? RankSplit::kTensorReplicatedCache : RankSplit::kTensorShardedCache, nullptr, fault);
    model->set_step_peers(peers.get());
  }
  ~TensorParallelGroup() { model->set_step_peers(nullptr); }
};

}  // namespace beluga::test
