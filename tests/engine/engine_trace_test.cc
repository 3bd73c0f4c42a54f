// BELUGA_TRACE's engine side (EngineConfig::trace_path): the Chrome-trace file the engine writes, and
// the serial reference loop (async_scheduling = false) against the overlapped one.
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/sampler.h"
#include "engine_test_support.h"

namespace beluga::engine_test {
namespace {

struct Span {
  std::string name;
  double ts, dur;
  int tid;
  int64_t step;
  double end() const { return ts + dur; }
};

// A mix that exercises every phase: greedy and sampled rows (seeded, top_p, penalties), n = 2,
// prefills longer than the step budget (chunked), outputs of several lengths.
std::vector<EngineRequest> mixed_requests(Collector& c,
                                          const std::function<std::vector<int>(int, int)>& prompt) {
  std::vector<EngineRequest> rs;
  for (int i = 0; i < 12; ++i) {
    EngineRequest r;
    r.id = str("r", i);
    r.prompt = prompt(3 + (i * 41) % 150, 500 + i);
    r.sampling.max_tokens = 4 + (i * 5) % 17;
    r.sampling.ignore_eos = true;
    if (i % 3 == 0) {
      r.sampling.temperature = 0;
    } else {
      r.sampling.temperature = 0.9f;
      r.sampling.top_p = i % 2 ? 0.9f : 1.0f;
      r.sampling.top_k = i % 4 == 1 ? 20 : 0;
      r.sampling.repetition_penalty = i % 5 == 2 ? 1.3f : 1.0f;
      r.sampling.frequency_penalty = i % 5 == 4 ? 0.4f : 0.0f;
      r.sampling.seed = uint64_t(1000 + i);
    }
    r.sampling.n = i % 4 == 3 ? 2 : 1;
    r.on_output = c.callback();
    rs.push_back(std::move(r));
  }
  return rs;
}

TEST_F(EngineTest, TraceFileHasNestedSpansCoveringEveryStep) {
  const std::string path = ::testing::TempDir() + "/beluga_engine_trace_test.json";
  std::remove(path.c_str());
  Collector c;
  int64_t steps = 0;
  {
    EngineConfig ec;
    ec.max_num_batched_tokens = 64;
    ec.num_kv_blocks = 256;
    ec.trace_path = path;
    Engine engine(*model_, ec);
    auto rs = mixed_requests(c, [&](int n, int s) { return prompt(n, s); });
    const size_t count = rs.size();
    for (auto& r : rs) ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
    ASSERT_TRUE(c.wait(count));
    steps = wait_idle(engine).steps;
  }  // the file is written when the engine stops
  ASSERT_GT(steps, 10);

  std::ifstream f(path);
  ASSERT_TRUE(f.good()) << path;
  const nlohmann::json j = nlohmann::json::parse(f);  // throws (fails the test) if the JSON is broken
  ASSERT_TRUE(j.contains("traceEvents"));
  std::map<int, std::string> lanes;
  std::vector<Span> spans;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M") {
      lanes[e["tid"].get<int>()] = e["args"]["name"].get<std::string>();
      continue;
    }
    ASSERT_EQ(e["ph"], "X");
    spans.push_back({e["name"].get<std::string>(), e["ts"].get<double>(), e["dur"].get<double>(),
                     e["tid"].get<int>(),
                     e.contains("args") ? e["args"]["step"].get<int64_t>() : int64_t(-1)});
    ASSERT_GE(spans.back().dur, 0.0);
  }
  EXPECT_EQ(j["otherData"]["dropped_events"], 0);
  int loop = -1, runner = -1, queue = -1;
  for (const auto& [tid, name] : lanes) {
    if (name == "engine loop") loop = tid;
    if (name == "model runner") runner = tid;
    if (name == "runner queue") queue = tid;
  }
  ASSERT_GE(loop, 0);
  ASSERT_GE(runner, 0);
  ASSERT_GE(queue, 0);

  // Loop iterations: disjoint "step" spans in order; every other loop span lies inside one of them,
  // and the phases of one iteration do not overlap each other.
  std::vector<Span> iters, phases, forwards, queued;
  for (const Span& s : spans) {
    if (s.tid == queue) {
      EXPECT_EQ(s.name, "queued");
      queued.push_back(s);
    } else if (s.tid == runner) {
      EXPECT_EQ(s.name, "forward");
      forwards.push_back(s);
    } else if (s.name == "step") {
      iters.push_back(s);
    } else {
      phases.push_back(s);
    }
  }
  const std::set<std::string> known = {"admit",          "schedule",         "wait",    "sample",
                                       "build batch",    "launch",           "deliver", "build batch (early)",
                                       "launch (early)", "finish early step"};
  const double eps = 0.002;  // the file's timestamps have nanosecond digits
  for (size_t i = 1; i < iters.size(); ++i) EXPECT_LE(iters[i - 1].end(), iters[i].ts + eps) << i;
  std::map<size_t, std::vector<Span>> by_iter;
  std::map<std::string, int> count;
  for (const Span& p : phases) {
    EXPECT_TRUE(known.count(p.name)) << p.name;
    count[p.name]++;
    auto it = std::upper_bound(iters.begin(), iters.end(), p.ts + eps,
                               [](double t, const Span& s) { return t < s.ts; });
    ASSERT_NE(it, iters.begin()) << p.name << " at " << p.ts << " before every step";
    --it;
    EXPECT_GE(p.ts + eps, it->ts) << p.name;
    EXPECT_LE(p.end(), it->end() + eps) << p.name << " at " << p.ts << " leaves its step";
    by_iter[size_t(it - iters.begin())].push_back(p);
  }
  for (auto& [i, ps] : by_iter) {
    std::sort(ps.begin(), ps.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
    for (size_t k = 1; k < ps.size(); ++k)
      EXPECT_LE(ps[k - 1].end(), ps[k].ts + eps) << ps[k - 1].name << " overlaps " << ps[k].name;
  }
  // Every step is covered: one forward per step (numbered 0..steps-1), one wait and one sample for
  // each, one launch and one batch build for each; the wait that collects a forward ends after it.
  ASSERT_EQ(int64_t(forwards.size()), steps);
  for (size_t k = 0; k < forwards.size(); ++k) EXPECT_EQ(forwards[k].step, int64_t(k));
  // Each forward's time in the runner's queue: from its launch to the forward's start.
  ASSERT_EQ(queued.size(), forwards.size());
  for (size_t k = 0; k < queued.size(); ++k) {
    EXPECT_EQ(queued[k].step, int64_t(k));
    EXPECT_LE(queued[k].end(), forwards[k].ts + eps) << "step " << k << " queued past its forward's start";
  }
  EXPECT_EQ(count["wait"], steps);
  EXPECT_EQ(count["sample"], steps);
  // A step is launched after the step ahead of it is applied, or early (its greedy rows' tokens
  // resolved by the runner) and finished once they are.
  // (No step here goes early: every one holds a row sampled on the host.)
  EXPECT_EQ(count["launch"] + count["launch (early)"], steps);
  EXPECT_EQ(count["build batch"] + count["build batch (early)"], steps);
  EXPECT_EQ(count["finish early step"], count["launch (early)"]);
  EXPECT_EQ(count["schedule"], int(iters.size()));
  EXPECT_EQ(count["deliver"], int(iters.size()));
  std::vector<Span> waits;
  for (const Span& p : phases)
    if (p.name == "wait") waits.push_back(p);
  std::sort(waits.begin(), waits.end(), [](const Span& a, const Span& b) { return a.ts < b.ts; });
  for (size_t k = 0; k < waits.size(); ++k) EXPECT_GE(waits[k].end() + eps, forwards[k].end()) << k;
  // Overlap: step N+1 is scheduled while N is in flight, i.e. the iteration that waits for forward N
  // scheduled after N was launched (queued). The serial loop schedules, launches and waits for the same
  // step. (Whether the forward is still computing when the schedule starts depends on how long this
  // tiny model's forwards take against the host's work, so that is not what this checks.)
  int overlapped = 0;
  for (auto& [i, ps] : by_iter) {
    const Span* sched = nullptr;
    for (const Span& p : ps)
      if (p.name == "schedule") sched = &p;
    for (const Span& p : ps)
      if (sched && p.name == "wait")
        for (size_t k = 0; k < waits.size(); ++k)
          if (std::abs(waits[k].ts - p.ts) < eps) overlapped += queued[k].ts < sched->ts;
  }
  EXPECT_EQ(overlapped, steps);
  std::remove(path.c_str());
}

TEST_F(EngineTest, TracePathThatCannotBeWrittenFailsAtConstruction) {
  EngineConfig ec;
  ec.num_kv_blocks = 64;
  ec.trace_path = "/nonexistent-dir/trace.json";
  EXPECT_THROW(Engine(*model_, ec), Error);
}

// Prompts in chunks of 64 tokens (several steps each), room for every request.
EngineConfig chunked_config() {
  EngineConfig ec;
  ec.max_num_batched_tokens = 64;
  ec.num_kv_blocks = 256;
  return ec;
}

// The serial reference (no overlap) gives exactly the overlapped loop's tokens, greedy and seeded
// sampling alike, and with no step in flight while it schedules.
TEST_F(EngineTest, SerialLoopGivesTheOverlappedLoopsTokens) {
  auto run = [&](bool async, const std::string& trace) {
    Collector c;
    EngineConfig ec = chunked_config();
    ec.async_scheduling = async;
    ec.trace_path = trace;
    {
      Engine engine(*model_, ec);
      auto rs = mixed_requests(c, [&](int n, int s) { return prompt(n, s); });
      const size_t count = rs.size();
      for (auto& r : rs) EXPECT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
      EXPECT_TRUE(c.wait(count));
      const EngineStats st = wait_idle(engine);
      EXPECT_EQ(st.kv_blocks_used, 0);
      if (!async) {
        EXPECT_EQ(st.steps_early, 0);  // nothing is launched before its tokens are known
      }
    }
    EXPECT_EQ(c.late, 0);
    return c.tokens;
  };
  const std::string path = ::testing::TempDir() + "/beluga_serial_trace_test.json";
  const auto overlapped = run(true, "");
  const auto serial = run(false, path);
  ASSERT_EQ(overlapped.size(), 12u);
  EXPECT_EQ(serial, overlapped);
  for (const auto& [id, seqs] : overlapped)
    for (const auto& [k, toks] : seqs) EXPECT_FALSE(toks.empty()) << id;

  // Serial: no schedule span starts while a forward runs.
  std::ifstream f(path);
  const nlohmann::json j = nlohmann::json::parse(f);
  std::vector<std::pair<double, double>> forwards;
  std::vector<double> schedules;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["name"] == "forward")
      forwards.emplace_back(e["ts"].get<double>(), e["ts"].get<double>() + e["dur"].get<double>());
    if (e["name"] == "schedule") schedules.push_back(e["ts"].get<double>());
  }
  ASSERT_FALSE(forwards.empty());
  for (double s : schedules)
    for (const auto& [b, e] : forwards) EXPECT_FALSE(s > b + 0.002 && s < e - 0.002) << "schedule at " << s;
  std::remove(path.c_str());
}

// Threads that poll for each other before blocking (EngineConfig::poll_micros, on by default for
// GPU backends) give the blocking loop's tokens, with early launches and serial steps alike: a wait
// that returned before its step was done would read another step's ids.
TEST_F(EngineTest, PollingThreadsGiveTheBlockingLoopsTokens) {
  auto run = [&](int poll_micros, bool early) {
    Collector c;
    EngineConfig ec = chunked_config();
    ec.poll_micros = poll_micros;
    ec.early_launch = early;
    Engine engine(*model_, ec);
    // Greedy (so steps launch early), prompts of several chunks, ends at different steps.
    for (int i = 0; i < 8; ++i) {
      std::string id = "g";
      id += std::to_string(i);
      EXPECT_EQ(engine.submit(greedy(id, prompt(10 + 23 * i, i), 12 + 5 * i, c)), SubmitStatus::kOk);
    }
    EXPECT_TRUE(c.wait(8));
    const EngineStats st = wait_idle(engine);
    EXPECT_EQ(st.kv_blocks_used, 0);
    EXPECT_EQ(c.late, 0);
    if (early) {
      EXPECT_GT(st.steps_early, 0) << "poll " << poll_micros;
    }
    return c.tokens;
  };
  const auto blocking = run(0, true);
  ASSERT_EQ(blocking.size(), 8u);
  EXPECT_EQ(run(1000000, true), blocking) << "polling for up to a second, early launches";
  EXPECT_EQ(run(1000000, false), blocking) << "polling, serial launches";
  EXPECT_EQ(run(30, true), blocking) << "polls that time out and block";
}

}  // namespace
}  // namespace beluga::engine_test
