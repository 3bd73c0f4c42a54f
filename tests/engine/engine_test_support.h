// Shared by the engine tests: a Collector of request outputs and the EngineTest fixture (the dsv3-tiny
// fixture checkpoint on the CPU backend, plus reference runs through the plain Generator).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "backend/cpu/cpu_ops.h"
#include "engine/engine.h"
#include "engine/generator.h"
#include "engine/thread_rank_peers.h"
#include "loader/weight_source.h"
#include "parallel/local_communicator.h"
#include "parallel/shard.h"
#include "util/error.h"

namespace beluga::engine_test {

// A two-rank CPU expert-parallel group over checkpoint `w`: the engine runs on `model` (rank 0), the
// other rank steps with it (ThreadRankPeers; `fault`: rank 1 fails as it says).
struct ExpertParallelPair {
  LocalGroup group{2};
  ExpertSharding sharding;
  ExpertParallelism ep;
  CpuOps ops{CpuOptions{1}};
  std::unique_ptr<Model> model;
  std::unique_ptr<ThreadRankPeers> peers;
  // `data_parallel`: attention data parallel (each rank steps its own sequences), else replicated.
  ExpertParallelPair(const ModelConfig& cfg, WeightSource& w, int max_positions, InjectedRankFault fault = {},
                     bool data_parallel = false)
      : sharding(ExpertSharding::contiguous(cfg.n_routed_experts, 2)),
        ep{&group.communicator(0), &sharding, !data_parallel},
        model(load_model(cfg, w, ops, max_positions, &ep)),
        peers(std::make_unique<ThreadRankPeers>(cfg, w, model->max_positions(), group, sharding,
                                                cpu_peer_ops(2, CpuOptions{1}), nullptr, fault,
                                                data_parallel)) {
    model->set_step_peers(peers.get());
  }
  ~ExpertParallelPair() { model->set_step_peers(nullptr); }
};

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::map<int, std::vector<int>>> tokens;
  std::map<std::string, std::map<int, FinishReason>> finish;
  std::map<std::string, int> cached;
  std::map<std::string, bool> done;
  std::map<std::string, std::map<int, int>> stop_token;
  std::map<std::string, std::string> error;
  std::map<std::string, bool> unavailable;  // the error was the instance's (RequestOutput::unavailable)
  std::map<std::string, std::vector<TokenLogprob>> prompt_lps;
  std::map<std::string, std::map<int, std::vector<TokenLogprob>>> logprobs;  // sampled tokens', if asked
  std::map<std::string, int> prompt_lp_outputs;  // outputs that carried prompt logprobs
  std::map<std::string, int> outputs;            // outputs so far
  std::map<std::string, int> prompt_lp_at;       // which output (0: the first) carried them
  int late = 0;  // outputs for a sequence or request that had already finished

  OutputCallback callback() {
    return [this](RequestOutput&& o) {
      std::lock_guard<std::mutex> lk(mu);
      if (done.count(o.request_id)) late++;
      if (!o.prompt_logprobs.empty()) {
        prompt_lp_outputs[o.request_id]++;
        prompt_lp_at[o.request_id] = outputs[o.request_id];
        prompt_lps[o.request_id] = std::move(o.prompt_logprobs);
      }
      outputs[o.request_id]++;
      for (auto& s : o.seqs) {
        if (finish[o.request_id].count(s.index)) late++;
        auto& v = tokens[o.request_id][s.index];
        v.insert(v.end(), s.tokens.begin(), s.tokens.end());
        auto& lp = logprobs[o.request_id][s.index];
        lp.insert(lp.end(), s.logprobs.begin(), s.logprobs.end());
        if (s.finish != FinishReason::kNone) finish[o.request_id][s.index] = s.finish;
        if (s.finish == FinishReason::kStop) stop_token[o.request_id][s.index] = s.stop_token;
      }
      cached[o.request_id] = o.cached_tokens;
      if (!o.error.empty()) error[o.request_id] = o.error;
      if (o.unavailable) unavailable[o.request_id] = true;
      if (o.finished) done[o.request_id] = true;
      cv.notify_all();
    };
  }
  size_t num_tokens(const std::string& id) {
    std::lock_guard<std::mutex> lk(mu);
    auto it = tokens.find(id);
    return it == tokens.end() || it->second.empty() ? 0 : it->second.begin()->second.size();
  }
  bool is_done(const std::string& id) {
    std::lock_guard<std::mutex> lk(mu);
    return done.count(id) > 0;
  }
  bool wait(size_t n, int seconds = 120) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(seconds), [&] { return done.size() >= n; });
  }
};

// Holds the engine thread inside a request's callback until released, so that submissions made
// meanwhile queue up deterministically.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool inside = false, open = false;
  OutputCallback wrap(OutputCallback inner, int seconds = 30) {
    return [this, inner, seconds](RequestOutput&& o) {
      {
        std::unique_lock<std::mutex> lk(mu);
        inside = true;
        cv.notify_all();
        cv.wait_for(lk, std::chrono::seconds(seconds), [&] { return open; });
      }
      inner(std::move(o));
    };
  }
  bool wait_inside(int seconds = 30) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(seconds), [&] { return inside; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu);
      open = true;
    }
    cv.notify_all();
  }
};

// A checkpoint loaded on the CPU backend (2 threads) for the test's fixture.
class ModelFixture : public ::testing::Test {
 protected:
  void load_fixture(const std::string& dir, int max_positions) {
    cfg_ = ModelConfig::from_file(dir + "/config.json");
    ckpt_ = std::make_unique<Checkpoint>(dir);
    ops_ = std::make_unique<CpuOps>(CpuOptions{2});
    model_ = load_model(cfg_, *ckpt_, *ops_, max_positions);
  }
  // A greedy request of `max_tokens` tokens (EOS ignored), `n` sequences, into `c`.
  static EngineRequest greedy(const std::string& id, std::vector<int> p, int max_tokens, Collector& c,
                              int n = 1) {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(p);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.sampling.n = n;
    r.on_output = c.callback();
    return r;
  }

  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<CpuOps> ops_;
  std::unique_ptr<Model> model_;
};

class EngineTest : public ModelFixture {
 protected:
  void SetUp() override { load_fixture(std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv3-tiny", 2048); }
  std::vector<int> prompt(int n, int seed) const {
    std::vector<int> p(n);
    for (int i = 0; i < n; ++i) p[i] = 2 + (i * 131 + seed * 977) % (cfg_.vocab_size - 2);
    return p;
  }
  std::vector<int> reference(const std::vector<int>& p, int max_tokens) {
    GenerateParams g;
    g.max_tokens = max_tokens;
    return Generator(*model_).generate({p}, g)[0];
  }
  // Prompt logprobs from one full-prompt pass of the plain generator: log-softmax (in double) of the
  // logits at position i scores prompt token i + 1.
  std::vector<std::vector<double>> reference_prompt_lps(const std::vector<int>& p) {
    const int V = cfg_.vocab_size;
    const std::vector<float> logits = Generator(*model_).prompt_logits(p);
    std::vector<std::vector<double>> out;
    for (size_t i = 0; i + 1 < p.size(); ++i) {
      const float* row = logits.data() + i * size_t(V);
      const double mx = *std::max_element(row, row + V);
      double sum = 0;
      for (int t = 0; t < V; ++t) sum += std::exp(double(row[t]) - mx);
      std::vector<double> lp(static_cast<size_t>(V));
      for (int t = 0; t < V; ++t) lp[size_t(t)] = double(row[t]) - mx - std::log(sum);
      out.push_back(std::move(lp));
    }
    return out;
  }
  // `got` against the reference for prompt `p` with k alternatives: one entry per prompt token after
  // the first, each the given token's logprob (within 1e-4), its rank, and the k best, best first.
  void expect_prompt_lps(const std::vector<TokenLogprob>& got, const std::vector<int>& p, int k,
                         const std::string& what) {
    const auto ref = reference_prompt_lps(p);
    ASSERT_EQ(got.size(), p.size() - 1) << what;
    for (size_t i = 0; i < got.size(); ++i) {
      const std::vector<double>& lp = ref[i];
      const TokenLogprob& g = got[i];
      ASSERT_EQ(g.token, p[i + 1]) << what << " @" << i;
      EXPECT_NEAR(g.logprob, lp[size_t(g.token)], 1e-4) << what << " @" << i;
      // Rank: 1 + the tokens clearly more likely, up to near-ties.
      int above = 0, near = 0;
      for (double x : lp) {
        above += x > lp[size_t(g.token)] + 1e-4;
        near += std::abs(x - lp[size_t(g.token)]) <= 1e-4;
      }
      EXPECT_GE(g.rank, above + 1) << what << " @" << i;
      EXPECT_LE(g.rank, above + near) << what << " @" << i;
      std::vector<double> sorted(lp);
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      ASSERT_EQ(g.top.size(), size_t(k)) << what << " @" << i;
      for (int j = 0; j < k; ++j) {
        const auto [id, v] = g.top[size_t(j)];
        EXPECT_NEAR(v, sorted[size_t(j)], 1e-4) << what << " @" << i << " top " << j;
        EXPECT_NEAR(v, lp[size_t(id)], 1e-4) << what << " @" << i << " top " << j;
      }
    }
  }
  EngineRequest with_prompt_lps(EngineRequest r, int k) {
    r.sampling.prompt_logprobs = k;
    return r;
  }
  // Stats once the engine has nothing left (outputs arrive before the stats that follow them).
  static EngineStats wait_idle(Engine& engine) {
    EngineStats st{};
    for (int i = 0; i < 2000; ++i) {
      st = engine.stats();
      if (st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return st;
  }
  static std::vector<int> head(const std::vector<int>& v, size_t n) {
    return {v.begin(), v.begin() + std::min(n, v.size())};
  }
  // `count` prompts: prompt i has length `len0 + len_step * i` and seed `seed0 + i`.
  std::vector<std::vector<int>> make_prompts(int count, int len0, int len_step, int seed0) const {
    std::vector<std::vector<int>> out;
    for (int i = 0; i < count; ++i) out.push_back(prompt(len0 + len_step * i, seed0 + i));
    return out;
  }
  // Submits prompts[i] greedily as request `prefix` + i; false (naming it) when one is refused.
  ::testing::AssertionResult submit_each(Engine& engine, const std::string& prefix,
                                         const std::vector<std::vector<int>>& ps, int max_tokens,
                                         Collector& c) {
    for (size_t i = 0; i < ps.size(); ++i) {
      const std::string id = str(prefix, i);
      if (engine.submit(greedy(id, ps[i], max_tokens, c)) != SubmitStatus::kOk)
        return ::testing::AssertionFailure() << id << " was refused";
    }
    return ::testing::AssertionSuccess();
  }
  // A request a failure cut short: it finished with an error, after a strict prefix of the reference
  // run `want` (what it produced before the failure is still right).
  static void expect_failed_with_prefix(Collector& c, const std::string& id, const std::vector<int>& want) {
    EXPECT_EQ(c.finish[id][0], FinishReason::kError) << id;
    EXPECT_EQ(c.tokens[id][0], head(want, c.tokens[id][0].size())) << id;
    EXPECT_LT(c.tokens[id][0].size(), want.size()) << id;
  }
  // After failures: no output came late, every KV block is free again, and a new request ("after":
  // prompt `p`, `max_tokens`) is served exactly as a reference run. Returns the idle engine's stats
  // from before that request.
  EngineStats expect_clean_and_serving(Engine& engine, Collector& c, const std::vector<int>& p,
                                       int max_tokens) {
    EXPECT_EQ(c.late, 0);
    const EngineStats st = wait_idle(engine);
    EXPECT_EQ(st.kv_blocks_used, 0);
    size_t done = 0;
    {
      std::lock_guard<std::mutex> lk(c.mu);
      done = c.done.size();
    }
    EXPECT_EQ(engine.submit(greedy("after", p, max_tokens, c)), SubmitStatus::kOk);
    EXPECT_TRUE(c.wait(done + 1));
    EXPECT_EQ(c.tokens["after"][0], reference(p, max_tokens));
    return st;
  }
};

}  // namespace beluga::engine_test
