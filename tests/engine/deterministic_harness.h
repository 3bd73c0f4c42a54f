// The batch-invariance check of `--deterministic`, shared by the CPU test (tests/engine) and the CUDA
// one (tests/gpu): a probe request (150-token prompt, 12 tokens, top-3 logprobs), greedy and sampled,
// alone in one step, then alone with 16-token chunks, among 7 and 63 other mixed requests (greedy and
// sampled, seeded and not, top-k, prompt lengths 3..154, half sharing the probe's first block), and
// after a prefix hit. Each run's token ids and logprob bits are compared with the alone run's.
// With speculative decoding (count_differing_runs(spec)): the runs speculate, the probe and most
// others ask for no logprobs (so that they draft), and the probe's ids are compared with the alone
// run's without speculation: verification under batch-invariant kernels gives plain decoding's tokens.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/spec_config.h"
#include "model/batch.h"
#include "model/model.h"

namespace beluga::deterministic_test {

// What one sequence produced: ids, each token's logprob bits and its top alternatives' bits.
struct Trace {
  std::vector<int> ids;
  std::vector<uint32_t> bits;  // logprob, then (token, logprob) of each top entry, per token
  int cached = 0;
  bool operator==(const Trace& o) const { return ids == o.ids && bits == o.bits; }
};

struct Outputs {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Trace> seqs;
  int done = 0;
  OutputCallback callback() {
    return [this](RequestOutput&& o) {
      std::lock_guard<std::mutex> lk(mu);
      Trace& t = seqs[o.request_id];
      t.cached = std::max(t.cached, o.cached_tokens);
      for (const SeqOutput& s : o.seqs) {
        t.ids.insert(t.ids.end(), s.tokens.begin(), s.tokens.end());
        for (const TokenLogprob& lp : s.logprobs) {
          t.bits.push_back(std::bit_cast<uint32_t>(lp.logprob));
          for (auto [tok, v] : lp.top) {
            t.bits.push_back(uint32_t(tok));
            t.bits.push_back(std::bit_cast<uint32_t>(v));
          }
        }
      }
      if (o.finished) ++done;
      cv.notify_all();
    };
  }
  bool wait(int n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(600), [&] { return done >= n; });
  }
};

struct Probe {
  bool sampled;
  std::vector<int> prompt;
};

// Runs probes on one loaded model (deterministic kernels or not) in fresh engines.
class Prober {
 public:
  Prober(Model& model, int vocab, bool deterministic) : model_(model), vocab_(vocab), det_(deterministic) {}

  std::vector<int> tokens(int n, int seed) const {
    std::vector<int> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) p[size_t(i)] = 2 + (i * 131 + seed * 977) % (vocab_ - 2);
    return p;
  }
  EngineRequest request(const std::string& id, std::vector<int> prompt, bool sampled, int max_tokens,
                        Outputs& out, bool logprobs = true) const {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.sampling.temperature = sampled ? 0.9f : 0.0f;
    if (sampled) r.sampling.top_p = 0.95f;  // no seed: the mode's seed 0
    r.sampling.logprobs = logprobs ? 3 : -1;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.on_output = out.callback();
    return r;
  }
  // The probe, submitted last after `others` mixed requests, in an engine with `budget` batched tokens
  // per step. With `warm`, the probe runs once before the batch, so the batch's probe starts from a
  // prefix-cache hit.
  // With `spec`, the engine speculates and the requests ask for logprobs only where noted above.
  Trace run(const Probe& probe, int others, int budget, bool warm = false, const SpecConfig& spec = {}) {
    EngineConfig ec;
    ec.num_kv_blocks = 512;
    ec.max_num_seqs = 64;
    ec.max_num_batched_tokens = budget;
    ec.deterministic = det_;
    ec.speculative = spec;
    const bool lps = !spec.enabled();
    Engine engine(model_, ec);
    Outputs out;
    int expect = 0;
    if (warm) {
      EXPECT_EQ(engine.submit(request("warm", probe.prompt, probe.sampled, 12, out, lps)), SubmitStatus::kOk);
      EXPECT_TRUE(out.wait(++expect));
    }
    for (int i = 0; i < others; ++i) {
      std::vector<int> p = tokens(3 + (i * 37) % 88, 100 + i);
      if (i % 2 == 0) {
        std::vector<int> shared(probe.prompt.begin(), probe.prompt.begin() + kKvBlockSize);
        shared.insert(shared.end(), p.begin(), p.end());
        p = std::move(shared);
      }
      EngineRequest r =
          request("other" + std::to_string(i), std::move(p), i % 3 != 0, 4 + i % 13, out, lps || i % 4 == 3);
      if (i % 4 == 1) r.sampling.seed = uint64_t(i);
      if (i % 5 == 2) r.sampling.top_k = 20;
      EXPECT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
    }
    expect += others;
    EXPECT_EQ(engine.submit(request("probe", probe.prompt, probe.sampled, 12, out, lps)), SubmitStatus::kOk);
    EXPECT_TRUE(out.wait(++expect));
    draft_tokens_ += engine.stats().spec_draft_tokens;
    std::lock_guard<std::mutex> lk(out.mu);
    // Every full block of the prompt but one that leaves a token to compute.
    if (warm) {
      EXPECT_EQ(out.seqs["probe"].cached, (int(probe.prompt.size()) - 1) / kKvBlockSize * kKvBlockSize);
    }
    return out.seqs["probe"];
  }
  // The whole comparison, greedy and sampled; the number of runs that differ from the alone run (the
  // caller expects 0 with the mode on). With `spec`, every run but the reference speculates.
  int count_differing_runs(const SpecConfig& spec = {}) {
    int differ = 0;
    for (bool sampled : {false, true}) {
      SCOPED_TRACE(sampled ? "sampled" : "greedy");
      const Probe probe{sampled, tokens(150, 7)};
      Trace alone = run(probe, 0, 2048);
      EXPECT_EQ(alone.ids.size(), 12u);
      EXPECT_EQ(alone.bits.size(), 12u * 7);
      if (spec.enabled()) alone.bits.clear();  // a speculating probe asks for no logprobs
      const struct {
        int others, budget;
        bool warm;
        const char* what;
      } runs[] = {{0, 2048, false, "batch of 1"},
                  {0, 16, false, "chunked prefill, batch of 1"},
                  {7, 48, false, "batch of 8, chunked"},
                  {63, 256, false, "batch of 64, chunked"},
                  {63, 2048, true, "batch of 64, prefix hit"},
                  {7, 32, true, "batch of 8, prefix hit, chunked"}};
      for (const auto& r : runs) {
        if (!spec.enabled() && r.others == 0 && r.budget == 2048) continue;  // the reference itself
        const bool same = run(probe, r.others, r.budget, r.warm, spec) == alone;
        if (det_) {
          EXPECT_TRUE(same) << r.what;
        }
        differ += !same;
      }
    }
    return differ;
  }

  // Draft tokens the speculating runs verified, in all.
  int64_t draft_tokens() const { return draft_tokens_; }

 private:
  Model& model_;
  int vocab_;
  bool det_;
  int64_t draft_tokens_ = 0;
};

}  // namespace beluga::deterministic_test
