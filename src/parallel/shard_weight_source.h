// A WeightSource for one rank of an expert-parallel group: passes every request on to `inner`
// except the routed experts' tensors of slots the rank does not hold (rank_needs_tensor), which
// find() reports absent and get() refuses, so a loader that asks for another rank's expert fails
// loudly instead of uploading it. Over a Checkpoint the tensors are mapped views: a rank reads (and
// uploads) only the bytes of the tensors it asks for.
#pragma once

#include "loader/weight_source.h"
#include "parallel/shard.h"
#include "util/error.h"

namespace beluga {

class ShardWeightSource : public WeightSource {
 public:
  ShardWeightSource(WeightSource& inner, const ExpertSharding& sharding, int rank)
      : inner_(inner), sharding_(sharding), rank_(rank) {}
  Tensor get(const std::string& name, const std::vector<int64_t>& shape, DType hint = DType::kBF16) override {
    BELUGA_CHECK(rank_needs_tensor(sharding_, rank_, name), "rank ", rank_,
                 " of the expert-parallel group does ", "not hold the expert of ", name);
    return inner_.get(name, shape, hint);
  }
  Tensor find(const std::string& name, const std::vector<int64_t>& shape,
              DType hint = DType::kBF16) override {
    if (!rank_needs_tensor(sharding_, rank_, name)) return {};
    return inner_.find(name, shape, hint);
  }
  Tensor get_ids(const std::string& name, const std::vector<int64_t>& shape, int64_t bound) override {
    return inner_.get_ids(name, shape, bound);
  }
  size_t total_bytes() const override { return inner_.total_bytes(); }

 private:
  WeightSource& inner_;
  const ExpertSharding& sharding_;
  int rank_;
};

}  // namespace beluga
