// The engine's device-sampling path (EngineConfig::device_sampling with a model sampler) against its
// host path, on the CPU: a reference SampleRowsOp (reference_sample_rows.h) implements
// backend/sample_rows.h's contract in double (the host sampler's arithmetic, given the row's uniform), so the
// two runs must give the same tokens and logprobs exactly. Covered: seeded temperature, top_k, top_p, min_p
// and mixes, greedy and sampled rows under a processor whose mask depends on the last accepted token (it has
// to be filled for step N+1 after step N's token, before the launch), min_tokens with a stop token, logprobs
// 0, n = 2, logit bias and repetition / presence / frequency penalties (logit edits, with a logprob), and
// steps that fall back to the host (a masked row whose mask fails); masks filled by the engine
// thread alone and by worker threads (EngineConfig::mask_threads). With async scheduling these steps
// are launched before the step ahead of them is applied (engine_launch.cc: launch_next early).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "engine/spec_config.h"
#include "engine_test_support.h"
#include "reference_sample_rows.h"

namespace beluga::engine_test {
namespace {

// Allows the tokens t with (t + last accepted) % 3 == 0: a mask that changes with every token.
class ModThree final : public LogitsProcessor {
 public:
  void fill_mask(uint32_t* m, int vocab) override {
    for (int t = 0; t < vocab; ++t)
      if ((t + last_) % 3 == 0) m[t >> 5] |= 1u << (t & 31);
  }
  void accept(int token) override {
    hist_.push_back(last_);
    last_ = token;
  }
  void rollback(int n) override {
    for (; n > 0 && !hist_.empty(); --n) {
      last_ = hist_.back();
      hist_.pop_back();
    }
  }
  bool is_accepting() const override { return true; }

 private:
  int last_ = 0;
  std::vector<int> hist_;
};

// ModThree whose mask fails (fill_mask throws) from its `fail_at`-th fill on.
class FailingModThree final : public LogitsProcessor {
 public:
  explicit FailingModThree(int fail_at) : fail_at_(fail_at) {}
  void fill_mask(uint32_t* m, int vocab) override {
    if (++fills_ >= fail_at_) throw std::runtime_error("grammar broke at fill " + std::to_string(fills_));
    inner_.fill_mask(m, vocab);
  }
  void accept(int token) override { inner_.accept(token); }
  void rollback(int n) override { inner_.rollback(n); }
  bool is_accepting() const override { return true; }

 private:
  ModThree inner_;
  int fail_at_, fills_ = 0;
};

struct Got {
  std::mutex mu;
  std::map<std::string, std::map<int, std::vector<int>>> tokens;
  std::map<std::string, std::map<int, std::vector<std::pair<float, int>>>> lps;
  std::map<std::string, std::map<int, std::vector<std::vector<std::pair<int, float>>>>> tops;
  std::map<std::string, std::string> error;
  int done = 0;
  std::condition_variable cv;
  OutputCallback callback() {
    return [this](RequestOutput&& o) {
      std::lock_guard<std::mutex> lk(mu);
      for (auto& s : o.seqs) {
        auto& v = tokens[o.request_id][s.index];
        v.insert(v.end(), s.tokens.begin(), s.tokens.end());
        for (const TokenLogprob& l : s.logprobs) {
          lps[o.request_id][s.index].emplace_back(l.logprob, l.rank);
          tops[o.request_id][s.index].push_back(l.top);
        }
      }
      if (!o.error.empty()) error[o.request_id] = o.error;
      if (o.finished) done++;
      cv.notify_all();
    };
  }
  bool wait(int n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(120), [&] { return done >= n; });
  }
};

class DeviceSampling : public EngineTest {
 protected:
  std::vector<EngineRequest> requests(Got& g, bool with_penalty) {
    std::vector<EngineRequest> rs;
    auto add = [&](const std::string& id, int plen, auto&& set) {
      EngineRequest r;
      r.id = id;
      r.prompt = prompt(plen, int(rs.size()) + 3);
      r.sampling.max_tokens = 12;
      r.sampling.ignore_eos = true;
      r.sampling.seed = 11 + rs.size();
      set(r.sampling, r);
      r.on_output = g.callback();
      rs.push_back(std::move(r));
    };
    add("temp", 9, [](SamplingParams& s, EngineRequest&) { s.temperature = 0.9f; });
    add("topk", 17, [](SamplingParams& s, EngineRequest&) { s.temperature = 1.0f, s.top_k = 20; });
    add("topp", 30, [](SamplingParams& s, EngineRequest&) { s.temperature = 0.8f, s.top_p = 0.7f; });
    add("minp", 5, [](SamplingParams& s, EngineRequest&) { s.temperature = 1.3f, s.min_p = 0.05f; });
    add("mix-n2", 40, [](SamplingParams& s, EngineRequest&) {
      s.temperature = 1.0f, s.top_k = 50, s.top_p = 0.9f, s.min_p = 0.01f, s.n = 2;
    });
    add("lp", 12, [](SamplingParams& s, EngineRequest&) { s.temperature = 0.7f, s.logprobs = 0; });
    add("top-lp", 15,
        [](SamplingParams& s, EngineRequest&) { s.temperature = 0.9f, s.top_p = 0.9f, s.logprobs = 5; });
    add("greedy-top-lp", 26,
        [](SamplingParams& s, EngineRequest&) { s.temperature = 0.0f, s.logprobs = 20; });
    add("greedy-mask", 21, [](SamplingParams& s, EngineRequest& r) {
      s.temperature = 0.0f;
      r.logits_processor = [] { return std::make_unique<ModThree>(); };
    });
    add("sampled-mask-n2", 8, [](SamplingParams& s, EngineRequest& r) {
      s.temperature = 1.0f, s.top_p = 0.95f, s.n = 2;
      r.logits_processor = [] { return std::make_unique<ModThree>(); };
    });
    add("greedy-mask-n2", 11, [](SamplingParams& s, EngineRequest& r) {
      s.temperature = 0.0f, s.n = 2;
      r.logits_processor = [] { return std::make_unique<ModThree>(); };
    });
    // A prompt holding most of the vocabulary once: whatever it generates, prompt lookup finds the
    // token in the prompt and drafts what followed it there.
    add("greedy-lookup", 1500, [](SamplingParams& s, EngineRequest& r) {
      s.temperature = 0.0f;
      for (size_t i = 0; i < r.prompt.size(); ++i) r.prompt[i] = int((i * 7 + 3) % 2048);
    });
    add("min-tokens", 14, [](SamplingParams& s, EngineRequest&) {
      s.temperature = 1.0f, s.min_tokens = 6, s.ignore_eos = false;
    });
    if (with_penalty) {
      add("penalty", 25,
          [](SamplingParams& s, EngineRequest&) { s.temperature = 1.0f, s.presence_penalty = 0.5f; });
      // Logit edits with the raw logprob (the edited distribution samples, the raw one scores).
      add("rep-lp", 33, [](SamplingParams& s, EngineRequest&) {
        s.temperature = 0.9f, s.repetition_penalty = 1.4f, s.logprobs = 0;
      });
      add("freq-bias", 19, [](SamplingParams& s, EngineRequest&) {
        s.temperature = 1.1f, s.top_k = 30, s.frequency_penalty = 0.7f, s.presence_penalty = -0.2f;
        s.logit_bias = {{5, 3.0f}, {17, -100.0f}, {40, 1.5f}};
      });
      // Greedy that may never repeat a token, with token 7 pushed to the top: 7 first, then never
      // again. Its next step must count the token the step ahead of it was still sampling (the early
      // launch's pending edit), or 7 comes back at once.
      add("greedy-no-repeat", 6, [](SamplingParams& s, EngineRequest&) {
        s.temperature = 0.0f, s.presence_penalty = 200.0f, s.max_tokens = 24;
        s.logit_bias = {{7, 100.0f}};
      });
      add("greedy-bias-mask", 12, [](SamplingParams& s, EngineRequest& r) {
        s.temperature = 0.0f, s.repetition_penalty = 0.8f, s.logit_bias = {{9, 2.0f}};
        r.logits_processor = [] { return std::make_unique<ModThree>(); };
      });
    }
    return rs;
  }
  // What the "device" sampler did in a run (read before the model drops it).
  struct SamplerCounts {
    int calls = 0, masked_rows = 0, edited_rows = 0, top_rows = 0;
    EngineStats stats;  // the engine's, once idle
  };
  // Tokens and logprobs of the requests with and without device sampling.
  void run(bool device, bool with_penalty, Got& g, SamplerCounts& counts, int mask_threads = 0,
           bool with_failing = false, bool async = true, const std::string& spec = "") {
    auto s = std::make_unique<ReferenceSampleRows>();
    const ReferenceSampleRows* sampler = s.get();
    if (device) model_->set_sampler(std::move(s));
    EngineConfig ec;
    ec.num_kv_blocks = 256;
    ec.max_num_batched_tokens = 32;  // chunked prefills beside decodes
    ec.device_sampling = device;
    ec.mask_threads = mask_threads;  // 5 constrained sequences: enough for the workers (mask_filler.h)
    ec.async_scheduling = async;     // on: masks filled while the step's forward runs
    if (!spec.empty()) ec.speculative = parse_spec_config(spec);
    {
      Engine engine(*model_, ec);
      auto rs = requests(g, with_penalty);
      if (with_failing) {
        EngineRequest r;
        r.id = "failing";
        r.prompt = prompt(10, 99);
        r.sampling.max_tokens = 12;
        r.sampling.ignore_eos = true;
        r.sampling.temperature = 0.0f;
        r.logits_processor = [] { return std::make_unique<FailingModThree>(4); };
        r.on_output = g.callback();
        rs.push_back(std::move(r));
      }
      const int n = int(rs.size());
      for (auto& r : rs) ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
      ASSERT_TRUE(g.wait(n));
      counts.stats = wait_idle(engine);
    }
    counts.calls = sampler->calls;
    counts.masked_rows = sampler->masked_rows;
    counts.edited_rows = sampler->edited_rows;
    counts.top_rows = sampler->top_rows;  // `sampler` is the model's until the next line
    model_->set_sampler(nullptr);
  }
};

TEST_F(DeviceSampling, SameTokensAndLogprobsAsTheHostPath) {
  for (const auto& [with_penalty, threads] : {std::pair{false, 0}, {true, 0}, {false, 3}, {true, 3}}) {
    Got host, dev;
    SamplerCounts unused, sampler;
    run(false, with_penalty, host, unused, threads);
    run(true, with_penalty, dev, sampler, threads);
    EXPECT_TRUE(host.error.empty() && dev.error.empty());
    EXPECT_EQ(dev.tokens, host.tokens) << "with_penalty " << with_penalty << ", mask threads " << threads;
    ASSERT_EQ(dev.lps.size(), host.lps.size());
    for (const auto& [id, seqs] : host.lps)
      for (const auto& [i, v] : seqs) {
        ASSERT_EQ(dev.lps[id][i].size(), v.size()) << id;
        for (size_t k = 0; k < v.size(); ++k) {
          EXPECT_NEAR(dev.lps[id][i][k].first, v[k].first, 1e-5) << id << " @" << k;
          EXPECT_EQ(dev.lps[id][i][k].second, v[k].second) << id << " @" << k;
          const auto &dt = dev.tops[id][i][k], &ht = host.tops[id][i][k];
          ASSERT_EQ(dt.size(), ht.size()) << id << " @" << k;
          for (size_t j = 0; j < ht.size(); ++j) {
            EXPECT_EQ(dt[j].first, ht[j].first) << id << " @" << k << " top " << j;
            EXPECT_NEAR(dt[j].second, ht[j].second, 1e-5) << id << " @" << k << " top " << j;
          }
        }
      }
    if (with_penalty)
      for (const auto& [i, v] : dev.tokens["greedy-no-repeat"]) {
        ASSERT_EQ(v.size(), 24u);
        EXPECT_EQ(v[0], 7);
        EXPECT_EQ(std::set<int>(v.begin(), v.end()).size(), v.size()) << "a token repeated";
      }
    for (const auto& [i, v] : host.tokens["greedy-mask"]) {
      int last = 0;
      for (int t : v) {
        EXPECT_EQ((t + last) % 3, 0);
        last = t;
      }
    }
    // Every sampling step runs on the "device", masks included, and penalty and bias rows as logit
    // edits (their counts including the token the step ahead was still sampling); the steps are
    // launched before the step ahead of them is applied (the constrained rows' masks filled once it
    // is): the mixed batch of the overlapped loop.
    EXPECT_GT(sampler.calls, 0);
    EXPECT_GT(sampler.masked_rows, 0);
    EXPECT_GT(sampler.top_rows, 0);  // top logprobs on the device too
    EXPECT_GT(sampler.stats.steps_early, sampler.stats.steps / 2);
    if (with_penalty) {
      EXPECT_GT(sampler.edited_rows, 0);
    } else {
      EXPECT_EQ(sampler.edited_rows, 0);
    }
  }
}

// A mask that fails while the step's forward runs (the engine fills device-sampled steps' masks
// beside the forward): the runner hands the logits back instead of sampling, the host path fails that
// request alone with its processor's error, and every other request gets the host path's tokens; the
// same with the masks filled before the launch (--no-async-scheduling).
TEST_F(DeviceSampling, AFailingMaskFailsItsRequestAlone) {
  for (bool async : {true, false}) {
    Got host, dev;
    SamplerCounts unused, sampler;
    run(false, false, host, unused, 0, true, async);
    run(true, false, dev, sampler, 0, true, async);
    ASSERT_EQ(dev.error.count("failing"), 1u) << async;
    // (the device path's fill fails, and so does the host path's refill of it: its error is the last one)
    EXPECT_NE(dev.error["failing"].find("grammar broke at fill"), std::string::npos) << dev.error["failing"];
    EXPECT_EQ(dev.error.size(), 1u);
    EXPECT_EQ(dev.tokens["failing"][0].size(), 3u) << "three tokens before its mask failed";
    EXPECT_EQ(dev.tokens, host.tokens) << "async " << async;
    EXPECT_GT(sampler.masked_rows, 0);
    // Overlapped, the step behind the one whose mask failed is launched once its tokens are on the
    // host (the engine knew the masks sent it there), never early and retried.
    if (async) {
      EXPECT_GT(sampler.stats.steps_early, 0);
      EXPECT_EQ(sampler.stats.steps_early_retried, 0);
    } else {
      EXPECT_EQ(sampler.stats.steps_early, 0);
    }
  }
}

// A speculative server (prompt lookup, two drafts per step): every step samples on the device, those
// that verify drafts too (each verify row draws with its output position's uniform; the drafts are
// accepted while equal to the draws); the tokens are the host path's without speculation (speculative
// sampling keeps the seeded stream).
TEST_F(DeviceSampling, SpeculativeStepsSampleOnTheDevice) {
  Got host, dev;
  SamplerCounts unused, sampler;
  run(false, true, host, unused);
  run(true, true, dev, sampler, 0, false, true,
      R"({"method":"ngram","num_speculative_tokens":2,"gating":"fixed","prompt_lookup_max":3,"prompt_lookup_min":1})");
  EXPECT_TRUE(host.error.empty() && dev.error.empty());
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_GT(sampler.calls, 0) << "no step sampled on the device";
  EXPECT_GT(sampler.stats.spec_draft_tokens, 0) << "nothing speculated";
  EXPECT_EQ(sampler.stats.steps_host_sampled, 0) << "steps sampled on the host";
  // The host-sampling run of the same requests counts its steps.
  EXPECT_GT(unused.stats.steps_host_sampled, 0);
}

}  // namespace
}  // namespace beluga::engine_test
