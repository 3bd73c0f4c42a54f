// Attention data parallelism over thread ranks: split_by_rank against hand-checked splits, and
// dsv2-lite-tiny stepped through ThreadRankPeers in data-parallel mode (rank 0's model given the
// whole step with the engine's block ids, each rank computing only its sequences in its own cache)
// against one model with every sequence in one cache: the logits (and greedy ids) of every step,
// including steps where a rank has no sequence and only serves the others' expert rows. Tolerance as
// model_expert_parallel_test.cc: max |dp - ref| <= 1e-5 * max |ref| per sequence and step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "engine/thread_rank_peers.h"
#include "loader/model_config.h"
#include "loader/weight_source.h"
#include "model/data_parallel_split.h"
#include "model/model.h"
#include "model_steps.h"
#include "parallel/live_placement.h"
#include "parallel/local_communicator.h"
#include "util/error.h"

namespace beluga {
namespace {

TEST(SplitByRank, EachRankGetsItsSequencesWithLocalBlocksAndTheirLogitRows) {
  Batch b;
  // seq 0: rank 1 (blocks 4, 5), 3 tokens; seq 1: rank 0 (block 1), 1 token; seq 2: rank 1 (block 7),
  // 2 tokens. Logit rows: seq 0's last, seq 1's, both of seq 2's (a verify step's shape).
  b.tokens = {10, 11, 12, 20, 30, 31};
  b.seqs = {{64, 3, {4, 5}}, {5, 1, {1}}, {0, 2, {7}}};
  b.logit_rows = {2, 3, 4, 5};
  std::vector<RankPart> parts(2);
  split_by_rank(b, 4, parts);
  EXPECT_EQ(parts[0].batch.tokens, (std::vector<int>{20}));
  ASSERT_EQ(parts[0].batch.seqs.size(), 1u);
  EXPECT_EQ(parts[0].batch.seqs[0].context_len, 5);
  EXPECT_EQ(parts[0].batch.seqs[0].block_table, (std::vector<int>{1}));
  EXPECT_EQ(parts[0].batch.logit_rows, (std::vector<int>{0}));
  EXPECT_EQ(parts[0].logit_index, (std::vector<int>{1}));
  EXPECT_EQ(parts[1].batch.tokens, (std::vector<int>{10, 11, 12, 30, 31}));
  ASSERT_EQ(parts[1].batch.seqs.size(), 2u);
  EXPECT_EQ(parts[1].batch.seqs[0].block_table, (std::vector<int>{0, 1}));
  EXPECT_EQ(parts[1].batch.seqs[1].block_table, (std::vector<int>{3}));
  EXPECT_EQ(parts[1].batch.seqs[1].query_len, 2);
  EXPECT_EQ(parts[1].batch.logit_rows, (std::vector<int>{2, 3, 4}));
  EXPECT_EQ(parts[1].logit_index, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(parts[0].token_rows, (std::vector<int>{3}));
  EXPECT_EQ(parts[1].token_rows, (std::vector<int>{0, 1, 2, 4, 5}));
  // Reused parts start empty: a step with only rank 0's sequence leaves rank 1 idle.
  Batch c;
  c.tokens = {40};
  c.seqs = {{9, 1, {2}}};
  c.logit_rows = {0};
  split_by_rank(c, 4, parts);
  EXPECT_TRUE(parts[1].batch.tokens.empty());
  EXPECT_TRUE(parts[1].batch.seqs.empty());
  EXPECT_TRUE(parts[1].logit_index.empty());
  EXPECT_EQ(parts[0].batch.seqs[0].block_table, (std::vector<int>{2}));
}

TEST(SplitByRank, RefusesASequenceOverTwoRanksAndBlocksPastTheGroup) {
  std::vector<RankPart> parts(2);
  Batch b;
  b.tokens = {1};
  b.seqs = {{64, 1, {3, 4}}};
  EXPECT_THROW(split_by_rank(b, 4, parts), Error);
  b.seqs = {{0, 1, {8}}};
  EXPECT_THROW(split_by_rank(b, 4, parts), Error);
}

const std::string kDpTinyDir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv2-lite-tiny";

// One step's work: the sequences taking part and their new tokens.
struct DpPlan {
  std::vector<int> seqs;
};

// Steps `prompts` through `model` (whose cache has `kv_blocks` blocks): sequence s owns blocks
// [first_block[s], +4), step 0 prefills every prompt, then each plan decodes its sequences with token
// 7 + step. Returns [seq][its steps][vocab] logits and, with `greedy`, the argmax ids instead.
std::vector<std::vector<std::vector<float>>> drive_dp(Model& m, KvCache& kv,
                                                      const std::vector<std::vector<int>>& prompts,
                                                      const std::vector<int>& first_block,
                                                      const std::vector<DpPlan>& plans, bool greedy,
                                                      std::vector<std::vector<int>>* ids) {
  const int V = m.config().vocab_size;
  std::vector<std::vector<std::vector<float>>> out(prompts.size());
  std::vector<int> len(prompts.size(), 0);
  for (size_t step = 0; step <= plans.size(); ++step) {
    std::vector<int> seqs;
    if (step == 0)
      for (size_t s = 0; s < prompts.size(); ++s) seqs.push_back(int(s));
    else
      seqs = plans[step - 1].seqs;
    Batch b;
    for (int s : seqs) {
      const std::vector<int> toks = step == 0 ? prompts[size_t(s)] : std::vector<int>{7 + int(step)};
      std::vector<int> table;
      for (int k = 0; k < 4; ++k) table.push_back(first_block[size_t(s)] + k);
      b.seqs.push_back({len[size_t(s)], int(toks.size()), table});
      b.tokens.insert(b.tokens.end(), toks.begin(), toks.end());
      b.logit_rows.push_back(int(b.tokens.size()) - 1);
      len[size_t(s)] += int(toks.size());
    }
    std::vector<float> lg(seqs.size() * size_t(V));
    std::vector<int32_t> g(seqs.size());
    std::vector<float> gp(seqs.size());
    ForwardOptions opt;
    if (greedy) {
      opt.greedy_tokens = g.data();
      opt.greedy_probs = gp.data();
    }
    m.forward(b, kv, greedy ? nullptr : lg.data(), opt);
    for (size_t i = 0; i < seqs.size(); ++i) {
      const size_t s = size_t(seqs[i]);
      if (greedy)
        (*ids)[s].push_back(g[i]);
      else
        out[s].emplace_back(lg.begin() + int64_t(i) * V, lg.begin() + int64_t(i + 1) * V);
    }
  }
  return out;
}

TEST(DataParallelPeers, EveryRankStepsOnlyItsSequencesAndTheLogitsEqualOneModel) {
  const ModelConfig cfg = ModelConfig::from_file(kDpTinyDir + "/config.json");
  Checkpoint ckpt(kDpTinyDir);
  const auto prompts = test::random_prompts(cfg.vocab_size, 11, {5, 17, 1, 9, 12, 3, 30});
  const int P = 32;  // blocks per rank
  for (int n : {2, 3}) {
    // Sequence s on rank s % n, at its own 4 blocks of that rank's range.
    std::vector<int> first(prompts.size()), on_rank(prompts.size());
    std::vector<int> used(size_t(n), 0);
    for (size_t s = 0; s < prompts.size(); ++s) {
      const int r = int(s) % n;
      on_rank[s] = r;
      first[s] = r * P + used[size_t(r)];
      used[size_t(r)] += 4;
    }
    // Decode steps: everyone; only rank 1's sequences (rank 0 and any others idle); only rank 0's;
    // one sequence of the last rank.
    std::vector<DpPlan> plans(4);
    for (size_t s = 0; s < prompts.size(); ++s) {
      plans[0].seqs.push_back(int(s));
      if (on_rank[s] == 1) plans[1].seqs.push_back(int(s));
      if (on_rank[s] == 0) plans[2].seqs.push_back(int(s));
    }
    plans[3].seqs = {n - 1};

    CpuOps ref_ops(CpuOptions{1});
    auto ref_model = load_model(cfg, ckpt, ref_ops, 256);
    KvCache ref_kv = ref_model->make_kv_cache(n * P);
    const auto ref = drive_dp(*ref_model, ref_kv, prompts, first, plans, false, nullptr);
    std::vector<std::vector<int>> ref_ids(prompts.size());
    KvCache ref_kv2 = ref_model->make_kv_cache(n * P);
    drive_dp(*ref_model, ref_kv2, prompts, first, plans, true, &ref_ids);

    for (bool greedy : {false, true}) {
      LocalGroup group(n);
      const ExpertSharding sharding = ExpertSharding::contiguous(cfg.n_routed_experts, n);
      CpuOps ops(CpuOptions{1});
      const ExpertParallelism ep{&group.communicator(0), &sharding, false};
      auto model = load_model(cfg, ckpt, ops, 256, &ep);
      ThreadRankPeers peers(cfg, ckpt, model->max_positions(), group, sharding,
                            cpu_peer_ops(n, CpuOptions{1}), nullptr, {}, true);
      model->set_step_peers(&peers);
      KvCache kv = model->make_kv_cache(P);  // rank 0's range only
      std::vector<std::vector<int>> ids(prompts.size());
      const auto got = drive_dp(*model, kv, prompts, first, plans, greedy, &ids);
      model->set_step_peers(nullptr);
      // Rank r's cache holds its sequences' KV and nothing of the others'.
      for (int r = 1; r < n; ++r) EXPECT_EQ(peers.kv_of(r).num_blocks, P) << "n=" << n;
      for (size_t s = 0; s < prompts.size(); ++s) {
        if (greedy) {
          EXPECT_EQ(ids[s], ref_ids[s]) << "n=" << n << " sequence " << s;
          continue;
        }
        ASSERT_EQ(got[s].size(), ref[s].size());
        for (size_t step = 0; step < ref[s].size(); ++step)
          EXPECT_TRUE(test::logits_close(got[s][step], ref[s][step]))
              << "n=" << n << " sequence " << s << " step " << step;
      }
    }
  }
}

// Live EPLB over data-parallel ranks: each rank counts the routing of its own sequences, the plan
// moves and replicates experts between steps, and the logits stay one model's.
TEST(DataParallelPeers, LiveEplbRebalancesAndTheLogitsStayOneModels) {
  const ModelConfig cfg = ModelConfig::from_file(kDpTinyDir + "/config.json");
  Checkpoint ckpt(kDpTinyDir);
  const auto prompts = test::random_prompts(cfg.vocab_size, 13, {9, 30, 4, 17});
  const int P = 32;
  const std::vector<int> first = {0, P, 4, P + 4};  // sequences 0, 2 on rank 0; 1, 3 on rank 1
  std::vector<DpPlan> plans(6);
  for (auto& p : plans) p.seqs = {0, 1, 2, 3};
  plans[2].seqs = {1, 3};  // rank 0 idle
  CpuOps ref_ops(CpuOptions{1});
  auto ref_model = load_model(cfg, ckpt, ref_ops, 256);
  KvCache ref_kv = ref_model->make_kv_cache(2 * P);
  const auto ref = drive_dp(*ref_model, ref_kv, prompts, first, plans, false, nullptr);

  const auto live_ptr = test::frequent_eplb(cfg, ckpt, false);
  LiveExpertPlacement& live = *live_ptr;
  LocalGroup group(2);
  const ExpertSharding sharding = live.initial_sharding();
  CpuOps ops(CpuOptions{1});
  const ExpertParallelism ep{&group.communicator(0), &sharding, false, &live};
  auto model = load_model(cfg, ckpt, ops, 256, &ep);
  ThreadRankPeers peers(cfg, ckpt, model->max_positions(), group, sharding, cpu_peer_ops(2, CpuOptions{1}),
                        &live, {}, true);
  model->set_step_peers(&peers);
  KvCache kv = model->make_kv_cache(P);
  const auto got = drive_dp(*model, kv, prompts, first, plans, false, nullptr);
  model->set_step_peers(nullptr);
  EXPECT_GE(live.rebalances(), 1);
  EXPECT_EQ(live.rebalances() + live.skipped(), 3) << "7 steps, a plan every 2";
  for (size_t s = 0; s < prompts.size(); ++s)
    for (size_t step = 0; step < ref[s].size(); ++step)
      EXPECT_TRUE(test::logits_close(got[s][step], ref[s][step])) << "sequence " << s << " step " << step;
}

TEST(DataParallelPeers, ReplicatedStepsAndMtpStepsAreRefused) {
  const ModelConfig cfg = ModelConfig::from_file(kDpTinyDir + "/config.json");
  Checkpoint ckpt(kDpTinyDir);
  LocalGroup group(2);
  const ExpertSharding sharding = ExpertSharding::contiguous(cfg.n_routed_experts, 2);
  ThreadRankPeers peers(cfg, ckpt, 256, group, sharding, cpu_peer_ops(2, CpuOptions{1}), nullptr, {}, true);
  Batch b;
  b.tokens = {3};
  b.seqs = {{0, 1, {0}}};
  EXPECT_THROW(peers.begin(b, 8, false), Error);
  const int32_t rows[] = {0};
  EXPECT_THROW(peers.begin_mtp(b, 8, rows, false), Error);
}

}  // namespace
}  // namespace beluga
