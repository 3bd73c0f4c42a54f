// Expert sharding: every expert held exactly once (contiguous), replicas, tensor-name filtering.
#include "parallel/shard.h"

#include <gtest/gtest.h>

#include "loader/weight_source.h"
#include "parallel/shard_weight_source.h"
#include "util/error.h"

namespace beluga {
namespace {

TEST(ExpertSharding, ContiguousHoldsEveryExpertExactlyOnce) {
  for (int E : {1, 4, 7, 8, 64, 160})
    for (int n = 1; n <= 4 && n <= E; ++n) {
      const ExpertSharding s = ExpertSharding::contiguous(E, n);
      std::vector<int> held(size_t(E), 0);
      int prev_end = 0;
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(s.slot_begin(r), prev_end);
        const int count = s.slot_end(r) - s.slot_begin(r);
        EXPECT_TRUE(count == E / n || count == E / n + 1) << "E=" << E << " n=" << n << " rank " << r;
        for (int e : s.local_experts(r)) ++held[size_t(e)];
        for (int p = s.slot_begin(r); p < s.slot_end(r); ++p) EXPECT_EQ(s.owner(p), r);
        prev_end = s.slot_end(r);
      }
      EXPECT_EQ(prev_end, E);
      for (int e = 0; e < E; ++e) EXPECT_EQ(held[size_t(e)], 1) << "E=" << E << " n=" << n << " expert " << e;
    }
}

TEST(ExpertSharding, UnevenSplitGivesTheFirstRanksOneMore) {
  const ExpertSharding s = ExpertSharding::contiguous(10, 4);  // 3, 3, 2, 2
  EXPECT_EQ(s.local_experts(0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(s.local_experts(1), (std::vector<int>{3, 4, 5}));
  EXPECT_EQ(s.local_experts(2), (std::vector<int>{6, 7}));
  EXPECT_EQ(s.local_experts(3), (std::vector<int>{8, 9}));
}

// 4 logical experts in 6 slots over 2 ranks: expert 0 has a replica on each rank, expert 3 too.
TEST(ExpertSharding, ReplicasRouteLocallyFirstThenByToken) {
  const ExpertSharding s(4, 2, {0, 1, 3, 2, 0, 3});
  EXPECT_EQ(s.local_experts(0), (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(s.local_experts(1), (std::vector<int>{2, 0, 3}));
  EXPECT_EQ(s.replicas(0), (std::vector<int>{0, 4}));
  EXPECT_EQ(s.route(0, 5, 0), 0);  // rank 0 has expert 0 in slot 0
  EXPECT_EQ(s.route(0, 5, 1), 4);  // rank 1 in slot 4
  EXPECT_EQ(s.route(1, 7, 1), 1);  // one replica, on rank 0
  EXPECT_EQ(s.route(2, 7, 0), 3);
  // A 3-rank group where rank 2 has no replica of expert 0: tokens alternate between the replicas.
  const ExpertSharding t(2, 3, {0, 0, 1});
  EXPECT_EQ(t.route(0, 0, 2), 0);
  EXPECT_EQ(t.route(0, 1, 2), 1);
  EXPECT_EQ(t.route(0, 2, 2), 0);
}

// kEven (live EPLB's choice) splits an expert's tokens over all its replicas, a local one included.
TEST(ExpertSharding, EvenChoiceSplitsTokensOverEveryReplica) {
  const ExpertSharding s(4, 2, {0, 1, 3, 2, 0, 3}, ExpertSharding::ReplicaChoice::kEven);
  for (int from : {0, 1}) {
    int at[6] = {};
    for (int t = 0; t < 100; ++t) ++at[s.route(0, t, from)];
    EXPECT_EQ(at[0], 50) << "from rank " << from;
    EXPECT_EQ(at[4], 50) << "from rank " << from;
  }
  EXPECT_EQ(s.route(1, 7, 1), 1);  // one replica
}

TEST(ExpertSharding, RefusesExpertsWithoutSlotsAndBadIds) {
  EXPECT_THROW(ExpertSharding(3, 1, {0, 1, 1}), Error);   // expert 2 has none
  EXPECT_THROW(ExpertSharding(2, 1, {0, 2}), Error);      // 2 is not an expert
  EXPECT_THROW(ExpertSharding::contiguous(2, 3), Error);  // a rank without a slot
}

TEST(ExpertSharding, ParsesExpertTensorNames) {
  auto a = parse_expert_tensor("model.layers.12.mlp.experts.37.down_proj.weight");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->layer, 12);
  EXPECT_EQ(a->expert, 37);
  auto b = parse_expert_tensor("layers.3.ffn.experts.5.w1.weight");  // DeepSeek-V4
  ASSERT_TRUE(b);
  EXPECT_EQ(b->expert, 5);
  EXPECT_FALSE(parse_expert_tensor("model.layers.1.mlp.shared_experts.up_proj.weight"));
  EXPECT_FALSE(parse_expert_tensor("model.layers.1.mlp.gate.weight"));
  EXPECT_FALSE(parse_expert_tensor("model.layers.1.mlp.experts.x.weight"));
}

TEST(ExpertSharding, EachRankNeedsOnlyItsExpertsAndAllElse) {
  const ExpertSharding s = ExpertSharding::contiguous(8, 2);
  for (int e = 0; e < 8; ++e) {
    const std::string n = "model.layers.1.mlp.experts." + std::to_string(e) + ".gate_proj.weight_scale_inv";
    EXPECT_EQ(rank_needs_tensor(s, 0, n), e < 4);
    EXPECT_EQ(rank_needs_tensor(s, 1, n), e >= 4);
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(rank_needs_tensor(s, r, "model.embed_tokens.weight"));
    EXPECT_TRUE(rank_needs_tensor(s, r, "model.layers.1.mlp.shared_experts.down_proj.weight"));
    EXPECT_TRUE(rank_needs_tensor(s, r, "model.layers.1.mlp.gate.weight"));
  }
}

TEST(ShardWeightSource, RefusesAnotherRanksExperts) {
  DummyWeights dummy(1);
  const ExpertSharding s = ExpertSharding::contiguous(4, 2);
  ShardWeightSource src(dummy, s, 1);
  EXPECT_FALSE(src.get("model.layers.1.mlp.experts.3.up_proj.weight", {2, 2}).empty());
  EXPECT_THROW(src.get("model.layers.1.mlp.experts.1.up_proj.weight", {2, 2}), Error);
  EXPECT_TRUE(src.find("model.layers.1.mlp.experts.0.up_proj.weight", {2, 2}).empty());
  EXPECT_FALSE(src.get("model.layers.1.mlp.gate.weight", {4, 2}).empty());
}

}  // namespace
}  // namespace beluga
