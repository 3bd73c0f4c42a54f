// The tail-latency policy: the step cost fit, the prefill budget it gives (hand-computed from an
// exactly fitted cost), the scheduler under it (decodes first, the budget per step, no starvation of
// a prompt under a steady decode load, shortest-first admission with aging), and the engine with the
// policy on giving the same greedy tokens as the plain generator.
#include <climits>

#include "engine/latency_policy.h"
#include "engine/scheduler.h"
#include "engine/step_cost.h"
#include "engine_test_support.h"

namespace beluga::engine_test {
namespace {

// a = 2^-8 s (3.90625 ms), b = 2^-14 s (0.06103515625 ms) per token: exact in binary.
constexpr double kA = 1.0 / 256, kB = 1.0 / 16384;

void fit_exact(StepCost& c) {
  for (int t : {8, 64, 200, 1000, 17}) c.observe(t, kA + kB * t);
}

TEST(StepCost, FitsALineExactlyAndNeedsDistinctTokenCounts) {
  StepCost c;
  EXPECT_FALSE(c.fitted());
  EXPECT_EQ(c.tokens_within(1.0), -1);
  for (int i = 0; i < 10; ++i) c.observe(32, 0.01);  // one x value: no slope
  EXPECT_FALSE(c.fitted());
  StepCost d(0.5);  // the decay does not matter on points on a line
  fit_exact(d);
  ASSERT_TRUE(d.fitted());
  EXPECT_NEAR(d.a(), kA, 1e-12);
  EXPECT_NEAR(d.b(), kB, 1e-12);
  EXPECT_NEAR(d.predict(100), kA + 100 * kB, 1e-12);
  // floor((10 ms - 3.90625 ms) / 0.06103515625 ms) = floor(99.84) = 99.
  EXPECT_EQ(d.tokens_within(0.010), 99);
  EXPECT_EQ(d.tokens_within(0.003), 0);  // below the fixed cost
  StepCost flat;
  for (int t : {8, 64, 200, 1000}) flat.observe(t, 0.002);
  ASSERT_TRUE(flat.fitted());
  EXPECT_EQ(flat.tokens_within(0.003), INT_MAX);  // no slope: any count fits
}

TEST(StepCost, FollowsADriftingMachine) {
  StepCost c(0.5);
  fit_exact(c);
  for (int i = 0; i < 60; ++i) c.observe(i % 2 ? 100 : 500, 2 * (kA + kB * (i % 2 ? 100 : 500)));
  EXPECT_NEAR(c.a(), 2 * kA, 1e-6);
  EXPECT_NEAR(c.b(), 2 * kB, 1e-9);
}

TEST(LatencyPolicy, PrefillBudgetFromTheFittedCost) {
  LatencyConfig lc;
  lc.itl_target_ms = 10;  // 99 tokens fit in a step
  lc.min_prefill_tokens = 16;
  LatencyPolicy p(lc);
  EXPECT_EQ(p.prefill_budget(30, 2048), 2018);  // not fitted yet: the cap's room
  fit_exact(p.cost());
  EXPECT_EQ(p.prefill_budget(0, 2048), 2048);  // no decodes to protect
  EXPECT_EQ(p.prefill_budget(10, 2048), 89);   // 99 - 10 (cost(10) = 4.52 ms: under half the target)
  // cost(17) = 4.944 ms < 5 ms: the target holds, 99 - 17.
  EXPECT_EQ(p.prefill_budget(17, 2048), 82);
  // Over half the target the step may take twice the decodes' cost: tokens_within(2a + 2bD) =
  // a/b + 2D = 64 + 2D, so the budget is 64 + D (a/b = 64 exactly).
  EXPECT_EQ(p.prefill_budget(30, 2048), 94);
  EXPECT_EQ(p.prefill_budget(200, 2048), 264);  // decodes alone are over the target
  EXPECT_EQ(p.prefill_budget(30, 60), 30);      // the cap's room is smaller
  EXPECT_EQ(p.prefill_budget(50, 60), 10);
  EXPECT_EQ(p.prefill_budget(70, 60), 0);
  LatencyConfig big_share = lc;
  big_share.min_prefill_tokens = 600;
  LatencyPolicy m(big_share);
  fit_exact(m.cost());
  EXPECT_EQ(m.prefill_budget(100, 2048), 600);   // 64 + 100, raised to the minimum share
  EXPECT_EQ(m.prefill_budget(1500, 2048), 548);  // room below the minimum share: the room
  LatencyConfig off;
  LatencyPolicy q(off);
  fit_exact(q.cost());
  EXPECT_EQ(q.prefill_budget(30, 2048), 2018);
}

TEST(LatencyPolicy, AdmissionShortestFirstUnlessAged) {
  LatencyConfig lc;
  lc.ttft_slo_ms = 1000;
  LatencyPolicy p(lc);
  EXPECT_TRUE(p.admits_before(0.1, 50, 0.2, 300));
  EXPECT_FALSE(p.admits_before(0.2, 300, 0.1, 50));
  EXPECT_TRUE(p.admits_before(1.5, 900, 0.9, 10));  // overdue goes first
  EXPECT_TRUE(p.admits_before(2.0, 900, 1.5, 10));  // both overdue: the older
  EXPECT_FALSE(p.admits_before(0.1, 50, 0.2, 50));  // a tie keeps arrival order (stable sort)
}

// A scheduler driven serially: each step is scheduled, committed, and every sampling chunk gets a
// token.
struct Sim {
  std::string salt;
  BlockManager bm{256, false};
  std::vector<std::unique_ptr<Seq>> seqs;
  Scheduler sched;
  explicit Sim(int max_tokens, const LatencyPolicy* policy) : sched(bm, 64, max_tokens, nullptr, 0, policy) {}
  Seq* add(int len, double arrival = 0) {
    auto s = std::make_unique<Seq>();
    s->order = int64_t(seqs.size());
    s->salt = &salt;
    s->traffic_class = &salt;
    for (int i = 0; i < len; ++i) s->tokens.push_back(3 + (i * 7 + int(seqs.size()) * 131) % 500);
    s->num_prompt = len;
    s->arrival = arrival;
    sched.add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  std::vector<Chunk> step(double now = 0) {
    std::vector<Chunk> chunks;
    Seq* stuck = nullptr;
    sched.schedule(chunks, &stuck, now);
    EXPECT_EQ(stuck, nullptr);
    sched.commit(chunks);
    for (const Chunk& c : chunks)
      if (c.sample) c.seq->tokens.push_back(9);
    return chunks;
  }
};

int prefill_of(const std::vector<Chunk>& chunks) {
  int n = 0;
  for (const Chunk& c : chunks)
    if (c.start < c.seq->num_prompt) n += c.len;
  return n;
}

TEST(LatencyScheduler, DecodesFirstAndTheBudgetPerStep) {
  LatencyConfig lc;
  lc.itl_target_ms = 10;  // 99 tokens per step
  lc.min_prefill_tokens = 16;
  LatencyPolicy p(lc);
  fit_exact(p.cost());
  Sim sim(2048, &p);
  for (int i = 0; i < 8; ++i) sim.add(20);
  EXPECT_EQ(prefill_of(sim.step()), 160);  // no decodes yet: the whole cap
  Seq* big = sim.add(400);
  int done = 0;
  for (int step = 0; big->num_output() == 0; ++step) {
    const auto chunks = sim.step();
    int decodes = 0;
    for (const Chunk& c : chunks) decodes += c.start >= c.seq->num_prompt;
    EXPECT_EQ(decodes, 8) << step;                                    // every decode, every step
    EXPECT_EQ(prefill_of(chunks), std::min(91, 400 - done)) << step;  // 99 - 8 decodes
    done += prefill_of(chunks);
    ASSERT_LT(step, 10);
  }
  EXPECT_EQ(done, 400);
}

TEST(LatencyScheduler, APromptUnderASteadyDecodeLoadIsNotStarved) {
  LatencyConfig lc;
  // No fixed cost, b = 2^-14 s per token: the 8 decodes cost 0.49 ms, twice that (over the 0.5 ms
  // target) leaves 8 prefill tokens, raised to the minimum share of 16.
  lc.itl_target_ms = 0.5;
  lc.min_prefill_tokens = 16;
  LatencyPolicy p(lc);
  for (int t : {8, 64, 200, 1000}) p.observe(t, kB * t);
  ASSERT_EQ(p.prefill_budget(8, 2048), 16);
  Sim sim(2048, &p);
  for (int i = 0; i < 8; ++i) sim.add(20);
  sim.step();
  Seq* big = sim.add(100);
  int steps = 0;
  while (big->num_output() == 0 && steps < 100) {
    EXPECT_EQ(prefill_of(sim.step()), std::min(16, 100 - 16 * steps));
    ++steps;
  }
  EXPECT_EQ(steps, 7);  // ceil(100 / 16)
  // The default scheduler takes it in one step.
  Sim plain(2048, nullptr);
  for (int i = 0; i < 8; ++i) plain.add(20);
  plain.step();
  Seq* b2 = plain.add(100);
  plain.step();
  EXPECT_EQ(b2->num_output(), 1);
}

TEST(LatencyScheduler, AdmissionShortestFirstWithAging) {
  LatencyConfig lc;
  lc.ttft_slo_ms = 1000;
  LatencyPolicy p(lc);
  Sim sim(2048, &p);
  Seq* a = sim.add(300, 0.0);
  Seq* b = sim.add(50, 0.1);
  Seq* c = sim.add(100, 0.2);
  auto chunks = sim.step(0.5);
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[0].seq, b);
  EXPECT_EQ(chunks[1].seq, c);
  EXPECT_EQ(chunks[2].seq, a);
  // Aged: the long prompt that waited past the SLO goes ahead of a newer short one.
  Sim aged(2048, &p);
  Seq* old_long = aged.add(300, 0.0);
  Seq* new_short = aged.add(50, 1.5);
  chunks = aged.step(1.6);
  ASSERT_EQ(chunks.size(), 2u);
  EXPECT_EQ(chunks[0].seq, old_long);
  EXPECT_EQ(chunks[1].seq, new_short);
  // Off: arrival order.
  Sim fifo(2048, nullptr);
  Seq* f0 = fifo.add(300);
  fifo.add(50);
  EXPECT_EQ(fifo.step(0.5)[0].seq, f0);
}

TEST_F(EngineTest, GreedyWithTheLatencyPolicyEqualsGenerator) {
  // A tight ITL target (only the minimum prefill share once decodes run) and a TTFT SLO that ages
  // prompts at once: chunking and admission order change, the tokens do not.
  EngineConfig ec;
  ec.max_num_batched_tokens = 96;
  ec.num_kv_blocks = 256;
  ec.latency.itl_target_ms = 1e-3;
  ec.latency.min_prefill_tokens = 16;
  ec.latency.ttft_slo_ms = 1e-3;
  Engine engine(*model_, ec);
  Collector c;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 24; ++i) prompts.push_back(prompt(3 + (i * 37) % 150, 300 + i));
  for (int i = 0; i < 24; ++i)
    ASSERT_EQ(engine.submit(greedy(str("l", i), prompts[i], 10, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(24));
  for (int i = 0; i < 24; ++i) EXPECT_EQ(c.tokens[str("l", i)][0], reference(prompts[i], 10)) << i;
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
}

TEST_F(EngineTest, ShortestFirstAdmissionUnderMemoryPressureKeepsResults) {
  // Preemption with the policy on: the preempted keep the front of the queue, results stay exact.
  EngineConfig ec;
  ec.num_kv_blocks = 12;
  ec.max_model_len = 700;
  ec.enable_prefix_caching = false;
  ec.latency.itl_target_ms = 1e-3;
  ec.latency.ttft_slo_ms = 1e6;  // never aged: shortest first throughout
  Engine engine(*model_, ec);
  Collector c;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(prompt(190 - 10 * i, 70 + i));
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(engine.submit(greedy(str("m", i), prompts[i], 40, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(8));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.tokens[str("m", i)][0], reference(prompts[i], 40)) << i;
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
}

}  // namespace
}  // namespace beluga::engine_test
