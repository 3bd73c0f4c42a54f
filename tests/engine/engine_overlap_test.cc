// The overlapped engine loop: step N+1 is scheduled and launched before step N's samples are applied
// (early, with N's tokens as future tokens the runner resolves, wherever N returns ids).
// Results equal one-at-a-time runs through finishes, aborts, preemption, failed steps and shutdown
// with a step in flight, and outputs go out while the next step runs.
#include "engine_test_support.h"

namespace beluga::engine_test {
namespace {

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
  // Greedy rows come back as ids: most steps were launched before the step ahead was applied.
  EXPECT_GT(st.steps_early, st.steps / 2);
  EXPECT_EQ(st.steps_early_retried, 0);
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
  EXPECT_GT(st.steps_early, 0);  // steps computing rows of sequences that had just stopped
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
  expect_clean_and_serving(engine, c, prompt(90, 4), 12);
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
  Gate gate;
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
  g.on_output = gate.wrap(g.on_output);
  ASSERT_EQ(engine.submit(std::move(g)), SubmitStatus::kOk);
  ASSERT_TRUE(gate.wait_inside());
  EngineRequest x = greedy("X", prompt(4, 2), 8, c);
  x.on_output = [&, inner = x.on_output](RequestOutput&& o) {
    const bool first = c.num_tokens("X") == 0 && !o.finished;
    inner(std::move(o));
    if (first) engine.submit(greedy("B", p, 4, c));
  };
  ASSERT_EQ(engine.submit(std::move(x)), SubmitStatus::kOk);
  ASSERT_EQ(engine.submit(greedy("A", p, 4, c)), SubmitStatus::kOk);
  gate.release();
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
  const auto ps = make_prompts(12, 10, 23, 500);
  ASSERT_TRUE(submit_each(engine, "f", ps, 10, c));
  ASSERT_TRUE(c.wait(12));
  int failed = 0;
  for (int i = 0; i < 12; ++i) {
    const std::string id = str("f", i);
    const auto want = reference(ps[size_t(i)], 10);
    if (c.finish[id][0] == FinishReason::kError) {
      ++failed;
      EXPECT_EQ(c.error[id], "step 6 failed");
      expect_failed_with_prefix(c, id, want);
    } else {
      EXPECT_EQ(c.tokens[id][0], want) << id;
    }
  }
  EXPECT_GT(failed, 0);
  EXPECT_LT(failed, 12);
  // Step 7 had been launched behind step 6 naming its tokens: skipped, then launched again without
  // the failed requests.
  EXPECT_GE(engine.stats().steps_early_retried, 1);
  expect_clean_and_serving(engine, c, ps[0], 10);
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

}  // namespace
}  // namespace beluga::engine_test
