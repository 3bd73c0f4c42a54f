// The serving engine on a real checkpoint (the dsv3-tiny fixture): results through continuous
// batching equal the plain generator's, alone and under concurrency; seeded sampling is reproducible
// under load; the prefix cache serves repeated prompts; preemption and aborts lose nothing.
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
#include "loader/weight_source.h"
#include "util/error.h"

namespace beluga {
namespace {

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::map<int, std::vector<int>>> tokens;
  std::map<std::string, std::map<int, FinishReason>> finish;
  std::map<std::string, int> cached;
  std::map<std::string, bool> done;
  std::map<std::string, std::map<int, int>> stop_token;
  std::map<std::string, std::string> error;
  std::map<std::string, std::vector<TokenLogprob>> prompt_lps;
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
        if (s.finish != FinishReason::kNone) finish[o.request_id][s.index] = s.finish;
        if (s.finish == FinishReason::kStop) stop_token[o.request_id][s.index] = s.stop_token;
      }
      cached[o.request_id] = o.cached_tokens;
      if (!o.error.empty()) error[o.request_id] = o.error;
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

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv3-tiny";
    cfg_ = ModelConfig::from_file(dir + "/config.json");
    ckpt_ = std::make_unique<Checkpoint>(dir);
    ops_ = std::make_unique<CpuOps>(CpuOptions{2});
    model_ = load_model(cfg_, *ckpt_, *ops_, 2048);
  }
  std::vector<int> prompt(int n, int seed) const {
    std::vector<int> p(n);
    for (int i = 0; i < n; ++i) p[i] = 2 + (i * 131 + seed * 977) % (cfg_.vocab_size - 2);
    return p;
  }
  EngineRequest greedy(const std::string& id, std::vector<int> p, int max_tokens, Collector& c) {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(p);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.on_output = c.callback();
    return r;
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

  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<CpuOps> ops_;
  std::unique_ptr<Model> model_;
};

TEST_F(EngineTest, GreedyEqualsGeneratorAloneAndUnderConcurrency) {
  // 32 concurrent requests of mixed lengths, with prefill chunking across steps (small token budget).
  EngineConfig ec;
  ec.max_num_batched_tokens = 96;
  ec.num_kv_blocks = 256;
  Engine engine(*model_, ec);
  Collector c;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 32; ++i) prompts.push_back(prompt(3 + (i * 37) % 150, i));
  for (int i = 0; i < 32; ++i)
    ASSERT_EQ(engine.submit(greedy(str("r", i), prompts[i], 12, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(32));
  for (int i = 0; i < 32; ++i) {
    EXPECT_EQ(c.tokens[str("r", i)][0], reference(prompts[i], 12)) << "request " << i;
    EXPECT_EQ(c.finish[str("r", i)][0], FinishReason::kLength);
  }
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, SeededSamplingIsReproducibleUnderLoad) {
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  Engine engine(*model_, ec);
  Collector c;
  auto seeded = [&](const std::string& id) {
    EngineRequest r;
    r.id = id;
    r.prompt = prompt(20, 99);
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.seed = 1234;
    r.sampling.max_tokens = 16;
    r.sampling.ignore_eos = true;
    r.sampling.n = 2;
    r.on_output = c.callback();
    return r;
  };
  ASSERT_EQ(engine.submit(seeded("alone")), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  for (int i = 0; i < 10; ++i) engine.submit(greedy(str("noise", i), prompt(5 + 13 * i, i), 20, c));
  ASSERT_EQ(engine.submit(seeded("loaded")), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(12));
  EXPECT_EQ(c.tokens["alone"][0], c.tokens["loaded"][0]);
  EXPECT_EQ(c.tokens["alone"][1], c.tokens["loaded"][1]);
  EXPECT_NE(c.tokens["alone"][0], c.tokens["alone"][1]);  // n=2 gives two different samples
}

TEST_F(EngineTest, RepeatedPromptHitsThePrefixCache) {
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*model_, ec);
  Collector c;
  auto p = prompt(300, 5);  // 4 full blocks + 44 tokens
  engine.submit(greedy("first", p, 4, c));
  ASSERT_TRUE(c.wait(1));
  engine.submit(greedy("second", p, 4, c));
  ASSERT_TRUE(c.wait(2));
  EXPECT_EQ(c.cached["first"], 0);
  EXPECT_EQ(c.cached["second"], 4 * kKvBlockSize);
  EXPECT_EQ(c.tokens["second"][0], c.tokens["first"][0]);
  // Another tenant (salt) gets no hit.
  EngineRequest other = greedy("tenant-b", p, 4, c);
  other.cache_salt = "key-b";
  engine.submit(std::move(other));
  ASSERT_TRUE(c.wait(3));
  EXPECT_EQ(c.cached["tenant-b"], 0);
  EngineStats st = engine.stats();
  EXPECT_EQ(st.prefix_cache_hits, 4 * kKvBlockSize);
  EXPECT_EQ(st.prefix_cache_queries, 900);
}

TEST_F(EngineTest, PreemptionUnderMemoryPressureKeepsResults) {
  // 12 blocks hold 768 tokens; 8 requests of ~150 + 40 tokens need more, so some are preempted and
  // recomputed.
  EngineConfig ec;
  ec.num_kv_blocks = 12;
  ec.max_model_len = 700;
  ec.enable_prefix_caching = false;
  Engine engine(*model_, ec);
  Collector c;
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 8; ++i) prompts.push_back(prompt(120 + 10 * i, 50 + i));
  for (int i = 0; i < 8; ++i)
    ASSERT_EQ(engine.submit(greedy(str("p", i), prompts[i], 40, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(8));
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c.tokens[str("p", i)][0], reference(prompts[i], 40)) << i;
  EXPECT_GT(engine.stats().preemptions, 0);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST_F(EngineTest, AbortFreesBlocksAndQueueLimitsHold) {
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  ec.max_queue_len = 4;
  ec.max_num_seqs = 1;
  Engine engine(*model_, ec);
  Collector c;
  ASSERT_EQ(engine.submit(greedy("long", prompt(100, 1), 2000, c)), SubmitStatus::kPromptTooLong);
  ASSERT_EQ(engine.submit(greedy("long", prompt(100, 1), 1500, c)), SubmitStatus::kOk);
  engine.abort("long");
  int queued = 0;
  for (int i = 0; i < 20; ++i)
    queued += engine.submit(greedy(str("q", i), prompt(10, i), 1500, c)) == SubmitStatus::kOk;
  EXPECT_LT(queued, 20);  // the queue filled up
  EXPECT_GE(queued, 3);
  for (int i = 0; i < 20; ++i) engine.abort(str("q", i));
  ASSERT_TRUE(c.wait(size_t(1 + queued)));
  EXPECT_EQ(c.finish["long"][0], FinishReason::kAbort);
  EngineStats st{};
  for (int i = 0; i < 100 && (st = engine.stats()).kv_blocks_used != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(st.kv_blocks_used, 0);
  // Still serving.
  ASSERT_EQ(engine.submit(greedy("after", prompt(8, 3), 3, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(size_t(2 + queued)));
  EXPECT_EQ(c.tokens["after"][0], reference(prompt(8, 3), 3));
}

// The overlapped loop (step N+1 scheduled and launched before step N's samples are applied) must give
// exactly what one-at-a-time runs give: mixed prompt lengths, chunked prefills, max_tokens from 1 up,
// n=2, more requests than max_num_seqs.
TEST_F(EngineTest, OverlappedStepsGiveOneAtATimeResults) {
  Collector c;
  EngineConfig ec;
  ec.max_num_batched_tokens = 64;
  ec.max_num_seqs = 8;
  ec.num_kv_blocks = 256;
  Engine engine(*model_, ec);
  constexpr int kRequests = 40;
  std::vector<std::vector<int>> prompts;
  std::vector<int> max_tokens, n;
  for (int i = 0; i < kRequests; ++i) {
    prompts.push_back(prompt(1 + (i * 53) % 200, 100 + i));
    max_tokens.push_back(1 + (i * 7) % 25);
    n.push_back(i % 5 == 0 ? 2 : 1);
  }
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r = greedy(str("m", i), prompts[size_t(i)], max_tokens[size_t(i)], c);
    r.sampling.n = n[size_t(i)];
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  }
  ASSERT_TRUE(c.wait(kRequests));
  int64_t expected_tokens = 0;
  for (int i = 0; i < kRequests; ++i) {
    const std::string id = str("m", i);
    const auto want = reference(prompts[size_t(i)], max_tokens[size_t(i)]);
    for (int k = 0; k < n[size_t(i)]; ++k) {
      EXPECT_EQ(c.tokens[id][k], want) << id << " seq " << k;
      EXPECT_EQ(c.finish[id][k], FinishReason::kLength) << id;
    }
    expected_tokens += int64_t(max_tokens[size_t(i)]) * n[size_t(i)];
  }
  EXPECT_EQ(c.late, 0);
  const EngineStats st = wait_idle(engine);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.requests_finished, kRequests);
  EXPECT_EQ(st.generation_tokens, expected_tokens);  // no row sampled twice, none skipped
}

// Requests that end (stop token or max_tokens) at every step: the sequence still has a chunk in the
// step scheduled behind it; nothing may come out after the finish and no block may leak.
TEST_F(EngineTest, FinishingAtEveryStepEmitsNothingAfterwards) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 256;
  Engine engine(*model_, ec);
  constexpr int K = 16;
  std::vector<std::vector<int>> prompts = {prompt(10, 7), prompt(70, 8), prompt(129, 9)};
  std::vector<std::vector<int>> refs;
  for (const auto& p : prompts) refs.push_back(reference(p, K));
  int64_t expected_tokens = 0;
  int count = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int j = 1; j <= K; ++j) {
      ASSERT_EQ(engine.submit(greedy(str("len", p, "-", j), prompts[p], j, c)), SubmitStatus::kOk);
      expected_tokens += j;
      ++count;
    }
    for (int j = 0; j < K; ++j) {
      EngineRequest r = greedy(str("stop", p, "-", j), prompts[p], K, c);
      r.sampling.stop_token_ids = {refs[p][size_t(j)]};
      r.sampling.n = j % 4 == 0 ? 2 : 1;
      const size_t first =
          size_t(std::find(refs[p].begin(), refs[p].end(), refs[p][size_t(j)]) - refs[p].begin());
      expected_tokens += int64_t(first + 1) * r.sampling.n;  // the stop token is sampled too
      ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
      ++count;
    }
  }
  ASSERT_TRUE(c.wait(size_t(count)));
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (int j = 1; j <= K; ++j) {
      const std::string id = str("len", p, "-", j);
      EXPECT_EQ(c.tokens[id][0], head(refs[p], size_t(j))) << id;
      EXPECT_EQ(c.finish[id][0], FinishReason::kLength) << id;
    }
    for (int j = 0; j < K; ++j) {
      const std::string id = str("stop", p, "-", j);
      const int stop = refs[p][size_t(j)];
      const size_t first = size_t(std::find(refs[p].begin(), refs[p].end(), stop) - refs[p].begin());
      for (int k = 0; k < (j % 4 == 0 ? 2 : 1); ++k) {
        EXPECT_EQ(c.tokens[id][k], head(refs[p], first)) << id;
        EXPECT_EQ(c.finish[id][k], FinishReason::kStop) << id;
        EXPECT_EQ(c.stop_token[id][k], stop) << id;
      }
    }
  }
  EXPECT_EQ(c.late, 0);
  const EngineStats st = wait_idle(engine);
  EXPECT_EQ(st.kv_blocks_used, 0);
  EXPECT_EQ(st.requests_finished, count);
  EXPECT_EQ(st.generation_tokens, expected_tokens);
}

// Aborts that land while the request's next step is already on the model: from the callback of its
// first output (its second token is in flight then), from another request's callback, and from
// another thread at arbitrary points. Nothing comes out after the abort, nothing leaks, and the
// requests around them are unaffected.
TEST_F(EngineTest, AbortsWhileInFlight) {
  Collector c;
  EngineConfig ec;
  ec.max_num_batched_tokens = 128;
  ec.num_kv_blocks = 256;
  Engine engine(*model_, ec);
  constexpr int kMax = 60;
  std::vector<std::vector<int>> prompts;
  std::vector<std::vector<int>> refs;
  for (int i = 0; i < 24; ++i) {
    prompts.push_back(prompt(5 + (i * 29) % 140, 300 + i));
    refs.push_back(reference(prompts.back(), kMax));
  }
  auto id = [](int i) { return str("a", i); };
  for (int i = 0; i < 24; ++i) {
    EngineRequest r = greedy(id(i), prompts[size_t(i)], kMax, c);
    if (i % 4 == 0) {  // aborts itself on its first output
      r.on_output = [&c, &engine, inner = r.on_output](RequestOutput&& o) {
        const bool first =
            !o.finished && !o.seqs.empty() && o.seqs[0].tokens.size() == 1 && c.num_tokens(o.request_id) == 0;
        const std::string rid = o.request_id;
        inner(std::move(o));
        if (first) engine.abort(rid);
      };
    } else if (i % 4 == 1) {  // aborts request i+1 on its first output
      r.on_output = [&c, &engine, inner = r.on_output, victim = id(i + 1)](RequestOutput&& o) {
        const bool first = c.num_tokens(o.request_id) == 0;
        inner(std::move(o));
        if (first) engine.abort(victim);
      };
    }
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  }
  // i % 4 == 3: aborted from this thread once it has produced i tokens (or at once when i is big).
  for (int i = 3; i < 24; i += 4) {
    for (int w = 0; w < 2000 && c.num_tokens(id(i)) < size_t(i) && !c.is_done(id(i)); ++w)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    engine.abort(id(i));
  }
  ASSERT_TRUE(c.wait(24));
  for (int i = 0; i < 24; ++i) {
    const auto& got = c.tokens[id(i)][0];
    EXPECT_EQ(got, head(refs[size_t(i)], got.size())) << id(i);
    if (i % 4 == 0) {
      EXPECT_EQ(got.size(), 1u) << id(i);  // the token in flight at the abort is never emitted
      EXPECT_EQ(c.finish[id(i)][0], FinishReason::kAbort) << id(i);
    } else if (i % 4 == 1) {
      EXPECT_EQ(got, refs[size_t(i)]) << id(i);
    }
  }
  EXPECT_EQ(c.late, 0);
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
  ASSERT_EQ(engine.submit(greedy("after", prompt(90, 4), 12, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(25));
  EXPECT_EQ(c.tokens["after"][0], reference(prompt(90, 4), 12));
}

// A cache of 8 blocks for requests that need far more: sequences are preempted, often while their
// sample is still in flight, and recomputed (with the prefix cache on, partly from their own blocks).
TEST_F(EngineTest, PreemptionWithSamplesInFlightKeepsResults) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 8;
  ec.max_model_len = 400;
  ec.max_num_batched_tokens = 256;
  Engine engine(*model_, ec);
  constexpr int kRequests = 10;
  std::vector<std::vector<int>> prompts, refs;
  const auto shared = prompt(64, 77);  // one full block shared by half of them
  for (int i = 0; i < kRequests; ++i) {
    auto p = prompt(60 + 17 * i, 400 + i);
    if (i % 2 == 0) p.insert(p.begin(), shared.begin(), shared.end());
    prompts.push_back(p);
    refs.push_back(reference(p, 50));
  }
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r = greedy(str("t", i), prompts[size_t(i)], 20 + 3 * i, c);
    r.sampling.n = i % 3 == 0 ? 2 : 1;
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  }
  ASSERT_TRUE(c.wait(kRequests));
  for (int i = 0; i < kRequests; ++i)
    for (int k = 0; k < (i % 3 == 0 ? 2 : 1); ++k)
      EXPECT_EQ(c.tokens[str("t", i)][k], head(refs[size_t(i)], size_t(20 + 3 * i))) << i;
  EXPECT_EQ(c.late, 0);
  const EngineStats st = wait_idle(engine);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

// The overlap itself, observed without timing: the callback of a request's first output (engine
// thread) waits for the forward of the following step to begin (model thread). A loop that ran the
// forward after the callbacks would never get there; the wait then gives up and the test fails.
TEST_F(EngineTest, OutputsAreEmittedWhileTheNextStepRuns) {
  std::mutex mu;
  std::condition_variable cv;
  int64_t started = 0;  // forwards begun
  bool overlapped = false;
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  ec.step_hook = [&](int64_t) {
    std::lock_guard<std::mutex> lk(mu);
    ++started;
    cv.notify_all();
  };
  Engine engine(*model_, ec);
  EngineRequest r = greedy("o", prompt(20, 1), 3, c);
  r.on_output = [&, inner = r.on_output](RequestOutput&& o) {
    if (c.num_tokens("o") == 0) {  // token 1, sampled from step 0; step 1 (token 2) is launched
      std::unique_lock<std::mutex> lk(mu);
      overlapped = cv.wait_for(lk, std::chrono::seconds(30), [&] { return started >= 2; });
    }
    inner(std::move(o));
  };
  ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  EXPECT_TRUE(overlapped);
  EXPECT_EQ(c.tokens["o"][0], reference(prompt(20, 1), 3));
}

// A failed forward fails the requests in its step. Its commit had already published blocks whose KV
// was never written: request B, admitted behind that step, took one of them from the prefix cache,
// so it fails too; the block leaves the index and a later request recomputes it. Step by step (the
// gate request holds the engine in its callback so X and A arrive together):
//   step 0: G (1 token).  step 1: X[0,4) + A[0,64) -> A's block 0 published.
//   step 2: X decode + A[64,130) -> A's block 1 published; X's first output then submits B.
//   B is admitted with blocks 0 and 1 from the cache; step 2 fails (the hook throws).
TEST_F(EngineTest, FailedStepFailsItsRequestsAndUnpublishesTheirBlocks) {
  std::mutex mu;
  std::condition_variable cv;
  bool in_gate = false, release_gate = false;
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  ec.max_num_batched_tokens = 68;
  ec.step_hook = [](int64_t step) {
    if (step == 2) throw std::runtime_error("injected device failure");
  };
  Engine engine(*model_, ec);
  const auto p = prompt(130, 21);
  EngineRequest g = greedy("G", prompt(4, 1), 1, c);
  g.on_output = [&, inner = g.on_output](RequestOutput&& o) {
    std::unique_lock<std::mutex> lk(mu);
    in_gate = true;
    cv.notify_all();
    cv.wait_for(lk, std::chrono::seconds(30), [&] { return release_gate; });
    lk.unlock();
    inner(std::move(o));
  };
  ASSERT_EQ(engine.submit(std::move(g)), SubmitStatus::kOk);
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return in_gate; }));
  }
  EngineRequest x = greedy("X", prompt(4, 2), 8, c);
  x.on_output = [&, inner = x.on_output](RequestOutput&& o) {
    const bool first = c.num_tokens("X") == 0 && !o.finished;
    inner(std::move(o));
    if (first) engine.submit(greedy("B", p, 4, c));
  };
  ASSERT_EQ(engine.submit(std::move(x)), SubmitStatus::kOk);
  ASSERT_EQ(engine.submit(greedy("A", p, 4, c)), SubmitStatus::kOk);
  {
    std::lock_guard<std::mutex> lk(mu);
    release_gate = true;
  }
  cv.notify_all();
  ASSERT_TRUE(c.wait(4));
  for (const char* id : {"X", "A", "B"}) {
    EXPECT_EQ(c.finish[id][0], FinishReason::kError) << id;
    EXPECT_EQ(c.error[id], "injected device failure") << id;
  }
  EXPECT_EQ(c.cached["B"], 2 * kKvBlockSize);  // it did take both blocks from the cache
  EXPECT_EQ(c.tokens["X"][0].size(), 1u);
  EXPECT_EQ(c.late, 0);
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
  // Block 0 (written by step 1) is still cached; block 1 (step 2) is not.
  ASSERT_EQ(engine.submit(greedy("C", p, 4, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(5));
  EXPECT_EQ(c.cached["C"], kKvBlockSize);
  EXPECT_EQ(c.tokens["C"][0], reference(p, 4));
}

// A forward error in the middle of busy traffic: the step's requests fail, everything else finishes
// as usual, nothing leaks, and the engine keeps serving.
TEST_F(EngineTest, FailedStepUnderLoadKeepsServing) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  ec.max_num_batched_tokens = 96;
  ec.step_hook = [](int64_t step) {
    if (step == 6) throw std::runtime_error("step 6 failed");
  };
  Engine engine(*model_, ec);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 12; ++i) prompts.push_back(prompt(10 + 23 * i, 500 + i));
  for (int i = 0; i < 12; ++i)
    ASSERT_EQ(engine.submit(greedy(str("f", i), prompts[size_t(i)], 10, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(12));
  int failed = 0;
  for (int i = 0; i < 12; ++i) {
    const std::string id = str("f", i);
    const auto want = reference(prompts[size_t(i)], 10);
    if (c.finish[id][0] == FinishReason::kError) {
      ++failed;
      EXPECT_EQ(c.error[id], "step 6 failed");
      EXPECT_EQ(c.tokens[id][0], head(want, c.tokens[id][0].size())) << id;
    } else {
      EXPECT_EQ(c.tokens[id][0], want) << id;
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, 12);
  EXPECT_EQ(c.late, 0);
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
  ASSERT_EQ(engine.submit(greedy("after", prompts[0], 10, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(13));
  EXPECT_EQ(c.tokens["after"][0], reference(prompts[0], 10));
}

// n=4 seeded samples that stop at different steps (many stop tokens): each sequence of the request
// finishes on its own while the others keep going, identically alone and under load.
TEST_F(EngineTest, SeededSequencesFinishingAtDifferentStepsAreReproducible) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  Engine engine(*model_, ec);
  auto seeded = [&](const std::string& id) {
    EngineRequest r;
    r.id = id;
    r.prompt = prompt(30, 31);
    r.sampling.temperature = 1.3f;
    r.sampling.seed = 99;
    r.sampling.max_tokens = 40;
    r.sampling.n = 4;
    for (int t = 0; t < cfg_.vocab_size; t += 9) r.sampling.stop_token_ids.push_back(t);
    r.on_output = c.callback();
    return r;
  };
  ASSERT_EQ(engine.submit(seeded("alone")), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  for (int i = 0; i < 8; ++i) engine.submit(greedy(str("noise", i), prompt(7 + 19 * i, i), 25, c));
  ASSERT_EQ(engine.submit(seeded("loaded")), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(10));
  std::set<size_t> lengths;
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(c.tokens["alone"][k], c.tokens["loaded"][k]) << k;
    EXPECT_EQ(c.finish["alone"][k], c.finish["loaded"][k]) << k;
    lengths.insert(c.tokens["alone"][k].size());
  }
  EXPECT_GT(lengths.size(), 1u);  // they did finish at different steps
  EXPECT_EQ(c.late, 0);
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
}

// Destroying the engine while a step is on the model: the step finishes, every request still there
// ends as aborted (after its earlier outputs, never twice), and nothing is left behind.
TEST_F(EngineTest, ShutdownWithAStepInFlight) {
  std::mutex mu;
  std::condition_variable cv;
  bool held = false, stopping = false;
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  ec.step_hook = [&](int64_t step) {
    if (step != 3) return;
    std::unique_lock<std::mutex> lk(mu);
    held = true;
    cv.notify_all();
    cv.wait_for(lk, std::chrono::seconds(30), [&] { return stopping; });
  };
  auto engine = std::make_unique<Engine>(*model_, ec);
  std::vector<std::vector<int>> prompts;
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(prompt(10 + 11 * i, 600 + i));
    ASSERT_EQ(engine->submit(greedy(str("s", i), prompts.back(), 100, c)), SubmitStatus::kOk);
  }
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return held; }));
    stopping = true;
  }
  cv.notify_all();
  engine.reset();
  ASSERT_TRUE(c.wait(6, 1));  // all final outputs were delivered before the destructor returned
  for (int i = 0; i < 6; ++i) {
    const std::string id = str("s", i);
    const auto& got = c.tokens[id][0];
    EXPECT_EQ(got, head(reference(prompts[size_t(i)], 100), got.size())) << id;
    // Aborted, unless (on a very slow machine) it ran all 100 steps before the destructor got in.
    if (c.finish[id][0] != FinishReason::kAbort) {
      EXPECT_EQ(got.size(), 100u) << id;
    }
  }
  EXPECT_EQ(c.late, 0);
}

// Prompt logprobs through chunked prefills (a small token budget splits prompts across steps, and
// across blocks), next to requests without them and with n=2: each request gets exactly one entry
// per prompt token after the first, in its first output, equal to one full-prompt pass; the
// generated tokens are unaffected (these greedy requests would otherwise take the device-argmax
// path, which writes no logits).
TEST_F(EngineTest, PromptLogprobsUnderChunkedPrefillAndConcurrency) {
  Collector c;
  EngineConfig ec;
  ec.max_num_batched_tokens = 48;
  ec.num_kv_blocks = 256;
  Engine engine(*model_, ec);
  const std::vector<int> lengths = {1, 2, 47, 48, 49, 64, 65, 130, 200};
  const std::vector<int> ks = {0, 3, 20, 1, 0, 5, 2, 20, 4};
  std::vector<std::vector<int>> prompts;
  for (size_t i = 0; i < lengths.size(); ++i) prompts.push_back(prompt(lengths[i], 700 + int(i)));
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest r = with_prompt_lps(greedy(str("pl", i), prompts[i], 6, c), ks[i]);
    if (i % 3 == 1) r.sampling.n = 2;
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
    ASSERT_EQ(engine.submit(greedy(str("plain", i), prompts[(i + 4) % prompts.size()], 8, c)),
              SubmitStatus::kOk);
  }
  ASSERT_TRUE(c.wait(2 * prompts.size()));
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string id = str("pl", i);
    const auto want = reference(prompts[i], 6);
    for (int k = 0; k < (i % 3 == 1 ? 2 : 1); ++k) EXPECT_EQ(c.tokens[id][k], want) << id << " seq " << k;
    EXPECT_EQ(c.tokens[str("plain", i)][0], reference(prompts[(i + 4) % prompts.size()], 8)) << i;
    if (lengths[i] == 1) {
      EXPECT_EQ(c.prompt_lp_outputs[id], 0) << id;  // nothing to score
      continue;
    }
    EXPECT_EQ(c.prompt_lp_outputs[id], 1) << id;
    EXPECT_EQ(c.prompt_lp_at[id], 0) << id;  // with the first token
    expect_prompt_lps(c.prompt_lps[id], prompts[i], ks[i], id);
    EXPECT_EQ(c.prompt_lp_outputs.count(str("plain", i)), 0u);
  }
  EXPECT_EQ(c.late, 0);
  EXPECT_EQ(wait_idle(engine).kv_blocks_used, 0);
}

// A prompt already in the prefix cache: a request that wants prompt logprobs computes it anyway (and
// reports every position); its blocks still serve the requests after it.
TEST_F(EngineTest, PromptLogprobsBypassThePrefixCache) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*model_, ec);
  const auto p = prompt(300, 9);  // 4 full blocks + 44 tokens
  ASSERT_EQ(engine.submit(greedy("warm", p, 4, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  ASSERT_EQ(engine.submit(with_prompt_lps(greedy("scored", p, 4, c), 2)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(2));
  EXPECT_EQ(c.cached["warm"], 0);
  EXPECT_EQ(c.cached["scored"], 0);
  EXPECT_EQ(c.tokens["scored"][0], c.tokens["warm"][0]);
  EXPECT_EQ(c.prompt_lp_outputs["scored"], 1);
  expect_prompt_lps(c.prompt_lps["scored"], p, 2, "scored");
  // Twice in a row, n=2: the second sequence may take what the first scored from the cache.
  EngineRequest again = with_prompt_lps(greedy("again", p, 4, c), 0);
  again.sampling.n = 2;
  ASSERT_EQ(engine.submit(std::move(again)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(3));
  EXPECT_EQ(c.prompt_lp_outputs["again"], 1);
  expect_prompt_lps(c.prompt_lps["again"], p, 0, "again");
  EXPECT_EQ(c.tokens["again"][1], c.tokens["warm"][0]);
  ASSERT_EQ(engine.submit(greedy("after", p, 4, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(4));
  EXPECT_EQ(c.cached["after"], 4 * kKvBlockSize);
  EXPECT_EQ(c.tokens["after"][0], c.tokens["warm"][0]);
}

// Preemption in the middle of prefills that score their prompts (8 blocks, a small token budget):
// a recomputed sequence neither skips nor repeats a position, and the prompt logprobs come once.
TEST_F(EngineTest, PromptLogprobsSurvivePreemption) {
  Collector c;
  EngineConfig ec;
  ec.num_kv_blocks = 8;
  ec.max_model_len = 400;
  ec.max_num_batched_tokens = 40;
  Engine engine(*model_, ec);
  constexpr int kRequests = 8;
  std::vector<std::vector<int>> prompts;
  const auto shared = prompt(64, 78);
  for (int i = 0; i < kRequests; ++i) {
    auto p = prompt(50 + 23 * i, 800 + i);
    if (i % 2 == 0) p.insert(p.begin(), shared.begin(), shared.end());
    prompts.push_back(p);
  }
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r = greedy(str("pp", i), prompts[size_t(i)], 30, c);
    if (i % 4 != 3) r.sampling.prompt_logprobs = i % 3;
    r.sampling.n = i % 3 == 0 ? 2 : 1;
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  }
  ASSERT_TRUE(c.wait(kRequests));
  for (int i = 0; i < kRequests; ++i) {
    const std::string id = str("pp", i);
    const auto want = reference(prompts[size_t(i)], 30);
    for (int k = 0; k < (i % 3 == 0 ? 2 : 1); ++k) EXPECT_EQ(c.tokens[id][k], want) << id << " seq " << k;
    if (i % 4 == 3) continue;
    EXPECT_EQ(c.prompt_lp_outputs[id], 1) << id;
    EXPECT_EQ(c.prompt_lp_at[id], 0) << id;
    expect_prompt_lps(c.prompt_lps[id], prompts[size_t(i)], i % 3, id);
  }
  EXPECT_EQ(c.late, 0);
  const EngineStats st = wait_idle(engine);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(st.kv_blocks_used, 0);
}

TEST_F(EngineTest, RejectsInvalidRequests) {
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  Engine engine(*model_, ec);
  Collector c;
  std::string why;
  EXPECT_EQ(engine.submit(greedy("empty", {}, 4, c), &why), SubmitStatus::kInvalid);
  EXPECT_EQ(engine.submit(greedy("vocab", {1, 99999}, 4, c), &why), SubmitStatus::kInvalid);
  EXPECT_NE(why.find("vocabulary"), std::string::npos);
  EXPECT_EQ(engine.submit(greedy("zero", {1, 2}, 0, c), &why), SubmitStatus::kInvalid);
  EXPECT_EQ(engine.submit(with_prompt_lps(greedy("plp21", {1, 2}, 4, c), 21), &why), SubmitStatus::kInvalid);
  EXPECT_EQ(engine.submit(with_prompt_lps(greedy("plp-2", {1, 2}, 4, c), -2), &why), SubmitStatus::kInvalid);
  EXPECT_EQ(engine.submit(with_prompt_lps(greedy("plp20", {1, 2}, 1, c), 20), &why), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
}

}  // namespace
}  // namespace beluga
