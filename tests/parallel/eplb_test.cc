// EPLB (src/parallel): the published README example, hand-checked small cases of each building block
// and policy, properties on skewed loads, the load window and the rebalance schedule presets.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "parallel/eplb.h"
#include "parallel/expert_load.h"
#include "parallel/expert_placement.h"
#include "util/error.h"

namespace beluga::parallel {
namespace {

TEST(Eplb, ReplicateGivesEachExtraSlotToTheHighestLoadPerReplica) {
  // Loads 4, 2, 1 into 5 slots. Slot 3: per replica 4, 2, 1 -> expert 0 (now 2 per replica).
  // Slot 4: 2, 2, 1 -> a tie, the first (expert 0) wins (now 4/3).
  const std::vector<double> w = {4, 2, 1};
  const Replication r = replicate_experts(w, 5);
  EXPECT_EQ(r.phy_to_log, (std::vector<int>{0, 1, 2, 0, 0}));
  EXPECT_EQ(r.rank, (std::vector<int>{0, 0, 0, 1, 2}));
  EXPECT_EQ(r.count, (std::vector<int>{3, 1, 1}));
  EXPECT_THROW(replicate_experts(w, 2), Error);
}

TEST(Eplb, BalancedPackingPutsTheHeaviestIntoTheLightestPackWithRoom) {
  // 5, 1, 4, 2 into 2 packs of 2. Heaviest first: 5 -> pack 0; 4 -> pack 1; 2 -> pack 1 (4 < 5), now
  // full; 1 -> pack 0. Loads 6 and 6.
  const std::vector<double> w = {5, 1, 4, 2};
  const Packing p = balanced_packing(w, 2);
  EXPECT_EQ(p.pack, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(p.rank_in_pack, (std::vector<int>{0, 1, 0, 1}));
  // One item per pack: the identity.
  const Packing id = balanced_packing(w, 4);
  EXPECT_EQ(id.pack, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_THROW(balanced_packing(w, 3), Error);
}

// deepseek-ai/EPLB's README: 2 layers of 12 experts, 16 slots, 4 groups, 2 nodes, 8 GPUs.
TEST(Eplb, MatchesThePublishedExample) {
  const std::vector<std::vector<double>> w = {{90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86},
                                              {20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27}};
  const std::vector<std::vector<int>> expected = {{5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1},
                                                  {7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1}};
  for (bool spread : {false, true}) {
    const EplbPlan plan = rebalance_experts(w, {16, 4, 2, 8}, {EplbPolicy::automatic, spread});
    EXPECT_TRUE(plan.hierarchical);
    ASSERT_EQ(plan.layers.size(), 2u);
    for (size_t l = 0; l < 2; ++l) {
      EXPECT_EQ(plan.layers[l].phy_to_log, expected[l]) << "layer " << l << " spread " << spread;
      for (int e = 0; e < 12; ++e)
        for (int p : plan.layers[l].log_to_phy[size_t(e)]) EXPECT_EQ(plan.layers[l].phy_to_log[size_t(p)], e);
    }
  }
}

// Loads 1, 7, 2, 2; 2 groups of 2, 2 nodes, 4 GPUs, 8 slots.
// Groups: 8 and 4, one per node: group 0 (experts 0, 1) -> node 0, group 1 -> node 1.
// Node 0, 4 slots: extras to expert 1 (7 -> 3.5) and again (3.5 > 1 -> 7/3). Replicas k0 = e0 (1),
//   k1..k3 = e1 (7/3). Packing onto GPUs 0, 1 (2 slots each): k1 -> g0, k2 -> g1, k3 -> g0 (tie, the
//   first; every GPU holds e1, so no spreading), k0 -> g1. Slots 0..3 = 1, 1, 1, 0.
// Node 1, 4 slots: extras to e2 (tie 2 vs 2, the first) then e3 (2 > 1). k0 = e2, k1 = e3, k2 = e2,
//   k3 = e3, all 1. k0 -> g2, k1 -> g3, k2 -> g2 by load (tie); g2 holds e2, g3 does not and takes it
//   at no cost to the maximum (2 either way) -> g3; k3 -> g2. Slots 4..7 = 2, 3, 3, 2. Without
//   spreading (the published code): 2, 2, 3, 3.
TEST(Eplb, HierarchicalHandCase) {
  const std::vector<std::vector<double>> w = {{1, 7, 2, 2}};
  const EplbPlan plan = rebalance_experts(w, {8, 2, 2, 4});
  ASSERT_TRUE(plan.hierarchical);
  const LayerPlan& l = plan.layers[0];
  EXPECT_EQ(l.phy_to_log, (std::vector<int>{1, 1, 1, 0, 2, 3, 3, 2}));
  EXPECT_EQ(l.replica_count, (std::vector<int>{1, 3, 2, 2}));
  EXPECT_EQ(l.log_to_phy[1], (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(l.log_to_phy[2], (std::vector<int>{4, 7}));
  EXPECT_EQ(l.log_to_phy[3], (std::vector<int>{6, 5}));
  const EplbPlan published = rebalance_experts(w, {8, 2, 2, 4}, {EplbPolicy::automatic, false});
  EXPECT_EQ(published.layers[0].phy_to_log, (std::vector<int>{1, 1, 1, 0, 2, 2, 3, 3}));
  EXPECT_EQ(gpu_loads(l, w[0], 4), (std::vector<double>{14.0 / 3, 1 + 7.0 / 3, 2, 2}));
}

// The same loads, global policy: 4 extras over all experts: e1 (7 -> 3.5), e1 (3.5 -> 7/3), e1
// (7/3 > 2 -> 1.75), then e2 (2 is the highest, the first of the two). Replicas by load: k3 = e3 (2);
// k1, k4, k5, k6 = e1 (1.75); k0 = e0, k2 = e2, k7 = e2 (1). Onto 4 GPUs of 2: k3 -> g0, k1 -> g1,
// k4 -> g2, k5 -> g3; k6 -> g1 (1.75, the lightest with room); k0 -> g2, k2 -> g3, k7 -> g0.
// GPU loads 3, 3.5, 2.75, 2.75: max/mean 3.5 / 3 against 7 / 3 contiguous. With spreading, k6 avoids
// g1 (which holds e1) for g0, the only GPU with room without e1 (3.75); then k0 -> g1, k2 -> g2,
// k7 -> g3: loads 3.75, 2.75, 2.75, 2.75 (e1 on four GPUs, at a higher maximum).
TEST(Eplb, GlobalHandCase) {
  const std::vector<std::vector<double>> w = {{1, 7, 2, 2}};
  const EplbPlan plan = rebalance_experts(w, {8, 2, 2, 4}, {EplbPolicy::global, false});
  ASSERT_FALSE(plan.hierarchical);
  EXPECT_EQ(plan.layers[0].phy_to_log, (std::vector<int>{3, 2, 1, 1, 1, 0, 1, 2}));
  EXPECT_EQ(plan.layers[0].replica_count, (std::vector<int>{1, 4, 2, 1}));
  const auto loads = gpu_loads(plan.layers[0], w[0], 4);
  EXPECT_EQ(loads, (std::vector<double>{3, 3.5, 2.75, 2.75}));
  EXPECT_DOUBLE_EQ(max_over_mean(loads), 3.5 / 3);
  const EplbPlan spread = rebalance_experts(w, {8, 2, 2, 4}, {EplbPolicy::global, true});
  EXPECT_EQ(spread.layers[0].phy_to_log, (std::vector<int>{3, 1, 1, 0, 1, 2, 1, 2}));
  EXPECT_EQ(gpu_loads(spread.layers[0], w[0], 4), (std::vector<double>{3.75, 2.75, 2.75, 2.75}));
  // 3 groups do not split over 2 nodes: automatic falls back to global, hierarchical refuses.
  const std::vector<std::vector<double>> six = {{1, 2, 3, 4, 5, 6}};
  EXPECT_FALSE(rebalance_experts(six, {8, 3, 2, 4}).hierarchical);
  EXPECT_THROW(rebalance_experts(six, {8, 3, 2, 4}, {EplbPolicy::hierarchical, true}), Error);
  EXPECT_THROW(rebalance_experts(six, {9, 3, 1, 4}), Error);  // 9 slots over 4 GPUs
}

std::vector<std::vector<double>> zipf_loads(int layers, int experts, double s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<double>> w(static_cast<size_t>(layers));
  for (auto& row : w) {
    std::vector<int> perm(static_cast<size_t>(experts));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    row.resize(size_t(experts));
    for (int e = 0; e < experts; ++e) row[size_t(perm[size_t(e)])] = std::round(1e5 / std::pow(e + 1, s));
  }
  return w;
}

// Every shape the bench runs, on V3's 256 experts in 8 groups with Zipf loads.
TEST(Eplb, PropertiesOnSkewedLoads) {
  struct Case {
    int gpus, nodes, redundant_per_gpu;
  };
  for (const Case c : {Case{8, 1, 1}, Case{8, 1, 4}, Case{16, 2, 1}, Case{32, 4, 4}, Case{64, 8, 1}})
    for (EplbPolicy policy : {EplbPolicy::hierarchical, EplbPolicy::global})
      for (uint64_t seed : {1, 2, 3}) {
        const auto w = zipf_loads(4, 256, 1.0, seed);
        const EplbShape shape{256 + c.redundant_per_gpu * c.gpus, 8, c.nodes, c.gpus};
        const EplbPlan plan = rebalance_experts(w, shape, {policy, true});
        const ExpertPlacement before = ExpertPlacement::contiguous(4, 256, c.gpus, c.nodes);
        const ExpertPlacement after(plan, c.gpus, c.nodes);
        EXPECT_EQ(after.slots_per_gpu(), shape.num_replicas / c.gpus);
        for (size_t l = 0; l < w.size(); ++l) {
          const LayerPlan& lp = plan.layers[l];
          int total = 0;
          for (int e = 0; e < 256; ++e) {
            const int n = lp.replica_count[size_t(e)];
            ASSERT_GE(n, 1);
            total += n;
            ASSERT_EQ(int(after.replicas(int(l), e).size()), n);
            // Replicas of one expert on distinct GPUs, wherever the GPUs it may use (its node's, or
            // all) outnumber its replicas.
            std::set<int> gpus;
            for (int p : lp.log_to_phy[size_t(e)]) gpus.insert(after.rank_of_slot(p));
            const int usable = policy == EplbPolicy::hierarchical ? c.gpus / c.nodes : c.gpus;
            if (n <= usable) {
              EXPECT_EQ(int(gpus.size()), n)
                  << "expert " << e << " seed " << seed << ", " << c.gpus << " GPUs";
            }
          }
          EXPECT_EQ(total, shape.num_replicas);
          // Every GPU has the same slot count (by construction of the slot index), and the heaviest
          // GPU is lighter than with contiguous placement and no replicas.
          std::vector<double> contiguous(static_cast<size_t>(c.gpus), 0.0);
          for (int e = 0; e < 256; ++e) contiguous[size_t(e / (256 / c.gpus))] += w[l][size_t(e)];
          EXPECT_LT(max_over_mean(gpu_loads(lp, w[l], c.gpus)), max_over_mean(contiguous))
              << c.gpus << " GPUs, seed " << seed;
          if (policy == EplbPolicy::hierarchical) {  // an expert's replicas stay on its group's node
            for (int e = 0; e < 256; ++e) {
              std::set<int> nodes;
              for (int p : lp.log_to_phy[size_t(e)]) nodes.insert(after.node_of_rank(after.rank_of_slot(p)));
              EXPECT_EQ(nodes.size(), 1u);
            }
          }
        }
        EXPECT_EQ(before.moved_slots(before), 0);
      }
}

TEST(ExpertPlacement, ChoosesAReplicaByTheTokensHashEvenly) {
  // Global hand case above, unspread: e1 on slots 2, 3 (GPU 1), 4 (GPU 2), 6 (GPU 3); 2 nodes of 2 GPUs.
  const std::vector<std::vector<double>> w = {{1, 7, 2, 2}};
  const ExpertPlacement pl(rebalance_experts(w, {8, 2, 2, 4}, {EplbPolicy::global, false}), 4, 2);
  EXPECT_EQ(std::vector<int>(pl.replicas(0, 1).begin(), pl.replicas(0, 1).end()),
            (std::vector<int>{2, 3, 4, 6}));
  EXPECT_EQ(pl.experts_on_rank(0, 1), (std::vector<int>{1, 1}));
  // Replicas by the token's hash: even shares, the same slot for the same token.
  int hits[8] = {};
  for (uint64_t t = 0; t < 40000; ++t) {
    const int p = pl.choose(0, 1, t);
    ++hits[p];
    EXPECT_EQ(p, pl.choose(0, 1, t));
  }
  for (int p : {2, 3, 4, 6}) EXPECT_NEAR(hits[p], 10000, 400) << p;
  EXPECT_EQ(hits[2] + hits[3] + hits[4] + hits[6], 40000);
  EXPECT_EQ(pl.choose(0, 0, 7), 5);  // one replica
  // Contiguous: expert e on GPU e / 1 for 4 experts on 4 GPUs; a moved slot count against the plan.
  const ExpertPlacement c = ExpertPlacement::contiguous(1, 4, 4, 2);
  EXPECT_EQ(c.choose(0, 3, 9), 3);
  EXPECT_THROW(c.moved_slots(pl), Error);  // 4 slots against 8
  EXPECT_EQ(pl.moved_slots(pl), 0);
}

// Rebalancing 8 GPUs' worth of plans: alignment keeps every GPU's load (its contents are some GPU's
// contents of the new plan, in its node), reproduces an unchanged placement exactly, and rewrites no
// more slots than the raw plan.
TEST(ExpertPlacement, AlignedToThePreviousPlacementMovesLess) {
  const auto a = zipf_loads(3, 64, 1.0, 7), b = zipf_loads(3, 64, 1.0, 8);
  const EplbShape shape{64 + 16, 8, 2, 8};
  const EplbPlan pa = rebalance_experts(a, shape), pb = rebalance_experts(b, shape);
  const ExpertPlacement prev(pa, 8, 2), next(pb, 8, 2);
  EXPECT_EQ(prev.aligned_to(prev, true).moved_slots(prev), 0);
  const ExpertPlacement aligned = next.aligned_to(prev, true);
  EXPECT_LE(prev.moved_slots(aligned), prev.moved_slots(next));
  for (int l = 0; l < 3; ++l) {
    std::multiset<std::multiset<int>> want, got;
    for (int r = 0; r < 8; ++r) {
      const auto x = next.experts_on_rank(l, r), y = aligned.experts_on_rank(l, r);
      want.insert(std::multiset<int>(x.begin(), x.end()));
      got.insert(std::multiset<int>(y.begin(), y.end()));
      // Within its node: GPU r of aligned holds what some GPU of r's node held in next.
      bool found = false;
      for (int q = 4 * (r / 4); q < 4 * (r / 4) + 4; ++q) {
        const auto z = next.experts_on_rank(l, q);
        found |= std::multiset<int>(z.begin(), z.end()) == std::multiset<int>(y.begin(), y.end());
      }
      EXPECT_TRUE(found) << "layer " << l << " rank " << r;
    }
    EXPECT_EQ(want, got);
    for (int e = 0; e < 64; ++e) EXPECT_EQ(aligned.replicas(l, e).size(), next.replicas(l, e).size());
  }
  // A placement with its GPUs' contents swapped back and forth: alignment undoes the shuffle.
  EplbPlan swapped = pa;
  for (auto& layer : swapped.layers)
    for (int k = 0; k < 10; ++k) std::swap(layer.phy_to_log[size_t(k)], layer.phy_to_log[size_t(k + 10)]);
  EXPECT_GT(prev.moved_slots(ExpertPlacement(swapped, 8, 2)), 0);
  EXPECT_EQ(prev.moved_slots(ExpertPlacement(swapped, 8, 2).aligned_to(prev, true)), 0);
}

TEST(ExpertLoadWindow, SumsTheLastStepsOnly) {
  ExpertLoadWindow win(2, 3, 2);
  win.add(0, 1, 5);
  EXPECT_EQ(win.load(0, 1), 0);  // the step in progress is not in the window
  win.end_step();                // window: {s1}
  EXPECT_EQ(win.load(0, 1), 5);
  const std::vector<int32_t> ids = {2, 2, 0, 1};
  win.add_routing(1, ids);
  win.end_step();  // window: {s1, s2}
  EXPECT_EQ(win.steps_in_window(), 2);
  EXPECT_EQ(win.load(0, 1), 5);
  EXPECT_EQ(win.load(1, 2), 2);
  win.add(0, 0, 7);
  win.end_step();  // window: {s2, s3}: s1 left
  EXPECT_EQ(win.load(0, 1), 0);
  EXPECT_EQ(win.load(0, 0), 7);
  EXPECT_EQ(win.load(1, 2), 2);
  win.end_step();  // {s3, s4}
  EXPECT_EQ(win.load(1, 2), 0);
  EXPECT_EQ(win.loads(), (std::vector<std::vector<double>>{{7, 0, 0}, {0, 0, 0}}));
  win.clear();
  EXPECT_EQ(win.steps_in_window(), 0);
  EXPECT_EQ(win.load(0, 0), 0);
  const std::vector<int32_t> bad = {3};
  EXPECT_THROW(win.add_routing(0, bad), Error);
  EXPECT_THROW(ExpertLoadWindow(1, 1, 0), Error);
}

TEST(RebalanceSchedule, PresetsAreDeepInfersKnobs) {
  const RebalanceSchedule p = RebalanceSchedule::prefill(), d = RebalanceSchedule::decode();
  EXPECT_EQ(p.redundant_per_gpu, 4);
  EXPECT_EQ(p.window_steps, 100);
  EXPECT_EQ(p.interval_steps, 1000);
  EXPECT_EQ(d.redundant_per_gpu, 1);
  EXPECT_EQ(d.window_steps, 1000);
  EXPECT_EQ(d.interval_steps, 10000);
  EXPECT_EQ(p.num_replicas(256, 32), 256 + 128);
  EXPECT_EQ(d.num_replicas(256, 64), 256 + 64);
  EXPECT_FALSE(p.due(0));
  EXPECT_FALSE(p.due(999));
  EXPECT_TRUE(p.due(1000));
  EXPECT_TRUE(d.due(20000));
  EXPECT_FALSE(d.due(1000));
}

}  // namespace
}  // namespace beluga::parallel
