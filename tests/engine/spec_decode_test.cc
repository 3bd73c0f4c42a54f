// Speculative decoding with the demo model's MTP module (engine level): greedy output is the same
// with and without speculation (batches, n > 1, prefix-cache hits, stop tokens, max_tokens edges,
// preemption), drafts are accepted at a real rate, KV blocks all come back, and bad configurations
// are refused with a clear error.
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>

#include "../common/tensor_parallel_pair.h"
#include "backend/cpu/cpu_ops.h"
#include "demo_model_test.h"
#include "engine/engine.h"
#include "engine/spec_config.h"
#include "engine_test_support.h"
#include "loader/weight_source.h"
#include "reference_sample_rows.h"

namespace beluga {
namespace {

using engine_test::Collector;
using engine_test::ExpertParallelPair;

class SpecDecodeTest : public engine_test::DemoModelTest {
 protected:
  static std::string name(const char* prefix, int i) {
    std::string s(prefix);
    s += std::to_string(i);
    return s;
  }
  // Fixed gating unless `gating` says otherwise: the statistics below assume every step verifies K.
  static EngineConfig config(int k, int blocks = 64, const char* gating = "fixed",
                             const char* method = "mtp") {
    EngineConfig ec;
    ec.num_kv_blocks = blocks;
    ec.max_num_seqs = 16;
    ec.max_model_len = 256;
    std::string j = std::string(R"({"method":")") + method;
    j += std::string(method) == "ngram" ? R"(","prompt_lookup_min":1,"prompt_lookup_max":3,)" : R"(",)";
    j += R"("num_speculative_tokens":)";
    j += std::to_string(k);
    j += R"(,"gating":")";
    j += gating;
    j += "\"}";
    if (k > 0) ec.speculative = parse_spec_config(j);
    return ec;
  }
  // What a run gave (a Collector's results, copyable).
  struct Outcome {
    std::map<std::string, std::map<int, std::vector<int>>> tokens;
    std::map<std::string, std::map<int, FinishReason>> finish;
    std::map<std::string, std::map<int, int>> stop_token;
  };
  // Runs `reqs` (built against the given collector) on an engine with config `ec`, all at once.
  // On `model` (default: the fixture's).
  Outcome run(const EngineConfig& ec, const std::function<std::vector<EngineRequest>(Collector&)>& reqs,
              EngineStats* stats = nullptr, Model* model = nullptr) {
    Collector c;
    Engine e(model ? *model : *model_, ec);
    auto rs = reqs(c);
    const size_t n = rs.size();
    for (auto& r : rs) EXPECT_EQ(e.submit(std::move(r)), SubmitStatus::kOk);
    EXPECT_TRUE(c.wait(n));
    const EngineStats st = wait_idle(e);
    EXPECT_EQ(st.kv_blocks_used, 0) << "every block comes back";
    if (stats) *stats = st;
    std::lock_guard<std::mutex> lk(c.mu);
    return {c.tokens, c.finish, c.stop_token};
  }

  // The parallel tests' mix: three prompts repeating a 9-token phrase (prompt lookup finds drafts), a
  // code prompt and (`more`) a second, longer one.
  std::vector<EngineRequest> parallel_requests(Collector& c, bool more) const {
    std::vector<EngineRequest> v;
    for (int i = 0; i < 3; ++i) {
      std::vector<int> p{0};
      for (int r = 0; r < 3; ++r)
        for (int j = 0; j < 9; ++j) p.push_back(100 + (j * 37 + i * 211) % 900);
      v.push_back(greedy(name("g", i), p, 24, c));
    }
    v.push_back(greedy("code", prompt(40, 3), 40, c));
    if (more) v.push_back(greedy("code2", prompt(70, 4), 30, c));
    return v;
  }
  static EngineStats wait_idle(Engine& engine) {  // outputs arrive before the stats that follow them
    EngineStats st{};
    for (int i = 0; i < 2000; ++i) {
      st = engine.stats();
      if (st.running == 0 && st.waiting == 0 && st.kv_blocks_used == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return st;
  }
};

TEST_F(SpecDecodeTest, GreedyOutputIsTheSameWithAndWithoutSpeculation) {
  auto reqs = [&](Collector& c) {
    std::vector<EngineRequest> v;
    for (int i = 0; i < 5; ++i) v.push_back(greedy(name("r", i), prompt(10 + 7 * i, i), 40 + i, c));
    v.push_back(greedy("n3", prompt(20, 9), 30, c, 3));
    for (int m = 1; m <= 4; ++m) v.push_back(greedy(name("max", m), prompt(12, m), m, c));
    return v;
  };
  EngineStats base_st;
  Outcome base = run(config(0), reqs, &base_st);
  EXPECT_EQ(base_st.spec_drafts, 0);
  EXPECT_TRUE(base_st.spec_accepted_per_position.empty());
  // K = 1..3, and K = 3 with the first MTP pass queued ahead of verification (EngineConfig::mtp_ahead:
  // off on the CPU by default), whose later passes pick each proposer's row on the device.
  for (int k : {1, 2, 3, -3}) {
    EngineConfig ec = config(std::abs(k));
    ec.mtp_ahead = k < 0 ? 1 : 0;
    k = std::abs(k);
    EngineStats st;
    Outcome spec = run(ec, reqs, &st);
    EXPECT_EQ(spec.tokens, base.tokens) << "K=" << k << " ahead " << ec.mtp_ahead;
    EXPECT_EQ(spec.finish, base.finish) << "K=" << k;
    // Drafts are verified and the MTP module's are right often (the demo's agrees with the main
    // model's next greedy token 73% of the time under teacher forcing).
    EXPECT_GT(st.spec_drafts, 50) << "K=" << k;
    EXPECT_GE(st.spec_draft_tokens, st.spec_drafts);
    EXPECT_GT(double(st.spec_accepted_tokens) / double(st.spec_draft_tokens), 0.3) << "K=" << k;
    ASSERT_EQ(st.spec_accepted_per_position.size(), size_t(k));
    int64_t sum = 0;
    for (size_t j = 0; j < st.spec_accepted_per_position.size(); ++j) {
      sum += st.spec_accepted_per_position[j];
      if (j > 0) {
        EXPECT_LE(st.spec_accepted_per_position[j], st.spec_accepted_per_position[j - 1]);
        // A chained draft is accepted often where its predecessor was (its token and hidden state
        // are the previous pass's: the chain on the device reads them there; wrong ones fall to ~0).
        EXPECT_GT(double(st.spec_accepted_per_position[j]),
                  0.35 * double(st.spec_accepted_per_position[j - 1]))
            << "K=" << k << " position " << j;
      }
    }
    EXPECT_EQ(sum, st.spec_accepted_tokens);
    EXPECT_LT(st.steps, base_st.steps) << "K=" << k << ": several tokens per step";
  }
}

// Prompt lookup through the same verifier: greedy output unchanged (batch, n > 1, max_tokens edges),
// and on prompts that repeat themselves drafts are verified and accepted, so fewer steps run.
TEST_F(SpecDecodeTest, NgramGreedyOutputIsTheSameAndDraftsAreAccepted) {
  auto repetitive = [&](int seed) {  // a 9-token phrase three times: its continuation is in the prompt
    std::vector<int> p{0};
    for (int r = 0; r < 3; ++r)
      for (int i = 0; i < 9; ++i) p.push_back(100 + (i * 37 + seed * 211) % 900);
    return p;
  };
  auto reqs = [&](Collector& c) {
    std::vector<EngineRequest> v;
    for (int i = 0; i < 4; ++i) v.push_back(greedy(name("g", i), repetitive(i), 30 + i, c));
    v.push_back(greedy("plain", prompt(17, 5), 24, c));
    v.push_back(greedy("n2", repetitive(7), 20, c, 2));
    for (int m = 1; m <= 3; ++m) v.push_back(greedy(name("max", m), repetitive(m + 10), m, c));
    return v;
  };
  EngineStats base_st;
  const Outcome base = run(config(0), reqs, &base_st);
  for (const char* gating : {"fixed", "cost", "confidence"})
    for (int k : {1, 3}) {
      EngineStats st;
      const Outcome o = run(config(k, 64, gating, "ngram"), reqs, &st);
      EXPECT_EQ(o.tokens, base.tokens) << gating << " K=" << k;
      EXPECT_EQ(o.finish, base.finish) << gating << " K=" << k;
      EXPECT_GT(st.spec_draft_tokens, 0) << gating << " K=" << k;
      EXPECT_GT(st.spec_accepted_tokens, 0) << gating << " K=" << k;
      if (std::string(gating) == "fixed") {
        EXPECT_LT(st.steps, base_st.steps) << "K=" << k << ": accepted drafts save steps";
      }
    }
}

// Speculation on two expert-parallel CPU ranks (each with its own KV and MTP caches): prompt lookup's
// verify rows are rows of the ordinary forward; MTP steps run on every rank too (the MTP layer's
// experts are sharded), each peer gathering its own input rows. The output is one rank's greedy output
// and the MTP drafts are one rank's (the same accepted counts, position by position).
TEST_F(SpecDecodeTest, SpeculationRunsExpertParallel) {
  auto reqs = [&](Collector& c) { return parallel_requests(c, false); };
  const Outcome base = run(config(0), reqs);
  EngineStats one;
  run(config(2), reqs, &one);  // MTP on one rank
  ExpertParallelPair pair(cfg_, *ckpt_, 1024);
  Model& rank0 = *pair.model;
  EngineStats st;
  EXPECT_EQ(run(config(2, 64, "fixed", "ngram"), reqs, &st, &rank0).tokens, base.tokens) << "ngram";
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(run(config(2), reqs, &st, &rank0).tokens, base.tokens) << "mtp";
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(st.spec_draft_tokens, one.spec_draft_tokens);
  EXPECT_EQ(st.spec_accepted_per_position, one.spec_accepted_per_position);
}

// The same on two attention data-parallel ranks (each stepping only its own sequences, with KV and
// MTP caches of its own): an MTP step's rows go to their sequences' ranks and read the hidden states
// that rank kept (begin_mtp_parts). Greedy output as one rank's, and the same drafts accepted.
TEST_F(SpecDecodeTest, SpeculationRunsDataParallel) {
  auto reqs = [&](Collector& c) { return parallel_requests(c, true); };
  const Outcome base = run(config(0), reqs);
  EngineStats one;
  run(config(3), reqs, &one);  // MTP on one rank
  ExpertParallelPair pair(cfg_, *ckpt_, 1024, {}, true);
  Model& rank0 = *pair.model;
  auto dp = [](EngineConfig ec) {
    ec.num_kv_blocks = 32;  // a rank
    return ec;
  };
  EngineStats st;
  EXPECT_EQ(run(dp(config(2, 64, "fixed", "ngram")), reqs, &st, &rank0).tokens, base.tokens) << "ngram";
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(run(dp(config(3)), reqs, &st, &rank0).tokens, base.tokens) << "mtp";
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(st.spec_draft_tokens, one.spec_draft_tokens);
  EXPECT_EQ(st.spec_accepted_per_position, one.spec_accepted_per_position);
}

// The same on two tensor-parallel ranks (the query heads and dense MLP split, the MoE's experts over
// the same ranks, every rank's MTP layer split likewise): greedy output as one model's, with the
// drafts accepted as one model accepts them (the ranks' sums are float rounding away).
TEST_F(SpecDecodeTest, SpeculationRunsTensorParallel) {
  auto reqs = [&](Collector& c) { return parallel_requests(c, true); };
  const Outcome base = run(config(0), reqs);
  test::TensorParallelGroup tp(cfg_, *ckpt_, 1024);
  EngineStats st;
  EXPECT_EQ(run(config(3), reqs, &st, tp.model.get()).tokens, base.tokens) << "mtp";
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_EQ(run(config(2, 64, "fixed", "ngram"), reqs, &st, tp.model.get()).tokens, base.tokens) << "ngram";
  EXPECT_GT(st.spec_accepted_tokens, 0);
}

// Cost gating switches between speculating and plain decode steps as its measurements say (it tries
// every draft count first, so a run mixes them): the output stays the model's greedy output, and
// drafts are still verified.
TEST_F(SpecDecodeTest, CostGatedOutputIsTheSame) {
  auto reqs = [&](Collector& c) {
    std::vector<EngineRequest> v;
    for (int i = 0; i < 6; ++i) v.push_back(greedy(name("c", i), prompt(12 + 5 * i, i + 30), 60 + 3 * i, c));
    return v;
  };
  const Outcome base = run(config(0), reqs);
  for (const char* gating : {"cost", "confidence"})
    for (int k : {1, 3}) {
      EngineStats st;
      const Outcome o = run(config(k, 64, gating), reqs, &st);
      EXPECT_EQ(o.tokens, base.tokens) << gating << " K=" << k;
      EXPECT_EQ(o.finish, base.finish) << gating << " K=" << k;
      EXPECT_GT(st.spec_draft_tokens, 0) << gating << " K=" << k;
    }
}

// A request whose prompt continues a speculated one hits the prefix cache in blocks that held draft
// tokens: only accepted KV may have been published, so its output is the same as without a cache.
TEST_F(SpecDecodeTest, PrefixCacheHitsAfterSpeculationKeepOutput) {
  Outcome first = run(config(2), [&](Collector& c) {
    return std::vector<EngineRequest>{greedy("a", prompt(40, 1), 100, c)};
  });
  std::vector<int> p2 = prompt(40, 1);
  const auto& out = first.tokens["a"][0];
  ASSERT_EQ(out.size(), 100u);
  p2.insert(p2.end(), out.begin(), out.begin() + 90);  // 130 tokens: two full blocks come from "a"

  EngineConfig nocache = config(0);
  nocache.enable_prefix_caching = false;
  Outcome base =
      run(nocache, [&](Collector& c) { return std::vector<EngineRequest>{greedy("b", p2, 30, c)}; });

  Collector c;
  Engine e(*model_, config(2));
  ASSERT_EQ(e.submit(greedy("a", prompt(40, 1), 100, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(1));
  ASSERT_EQ(c.tokens["a"][0], out);
  ASSERT_EQ(e.submit(greedy("b", p2, 30, c)), SubmitStatus::kOk);
  ASSERT_TRUE(c.wait(2));
  EXPECT_EQ(c.cached["b"], 128) << "two blocks from the speculated request";
  EXPECT_EQ(c.tokens["b"][0], base.tokens["b"][0]);
  EXPECT_EQ(wait_idle(e).kv_blocks_used, 0);
}

// A stop token met among accepted drafts ends the sequence there, as without speculation.
TEST_F(SpecDecodeTest, StopTokensEndAtTheSameToken) {
  Outcome ref = run(
      config(0), [&](Collector& c) { return std::vector<EngineRequest>{greedy("s", prompt(16, 3), 40, c)}; });
  const auto& full = ref.tokens["s"][0];
  ASSERT_EQ(full.size(), 40u);
  for (size_t at : {size_t(5), size_t(17), size_t(30)}) {
    auto reqs = [&](Collector& c) {
      EngineRequest r = greedy("s", prompt(16, 3), 40, c);
      r.sampling.stop_token_ids = {full[at]};
      return std::vector<EngineRequest>{std::move(r)};
    };
    Outcome base = run(config(0), reqs);
    Outcome spec = run(config(3), reqs);
    EXPECT_EQ(spec.tokens, base.tokens) << "stop at " << at;
    EXPECT_EQ(spec.finish["s"][0], FinishReason::kStop);
    EXPECT_EQ(spec.stop_token["s"][0], full[at]);
  }
}

// Under memory pressure sequences are preempted and recomputed (their drafts and MTP KV too).
TEST_F(SpecDecodeTest, PreemptionKeepsOutput) {
  auto reqs = [&](Collector& c) {
    std::vector<EngineRequest> v;
    for (int i = 0; i < 6; ++i) v.push_back(greedy(name("p", i), prompt(30, i + 20), 70, c));
    return v;
  };
  Outcome base = run(config(0, 64), reqs);
  EngineStats st;
  Outcome spec = run(config(2, 8), reqs, &st);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_EQ(spec.tokens, base.tokens);
}

// Sampled requests (temperature > 0 with top_p / top_k / min_p, n > 1) speculate too, verified by
// rejection sampling (draft_verifier.h): drafts are accepted, a seeded request gives the same tokens
// run to run and the same as without speculation (each position draws with the uniform plain sampling
// uses), whatever the gate chose; top_k 1 is the greedy output.
TEST_F(SpecDecodeTest, SampledRequestsSpeculate) {
  auto sampled = [&](const std::string& id, int seed, Collector& c) {
    EngineRequest r = greedy(id, prompt(20, seed), 32, c);
    r.sampling.temperature = 0.8f;
    r.sampling.seed = uint64_t(seed);
    return r;
  };
  auto reqs = [&](Collector& c) {
    std::vector<EngineRequest> v{greedy("g", prompt(20, 4), 30, c), sampled("t", 5, c)};
    v.push_back(sampled("top_p", 6, c));
    v.back().sampling.top_p = 0.9f;
    v.push_back(sampled("top_k", 7, c));
    v.back().sampling.top_k = 20;
    v.push_back(sampled("min_p", 8, c));
    v.back().sampling.min_p = 0.05f;
    v.back().sampling.temperature = 1.2f;
    v.push_back(sampled("n2", 9, c));
    v.back().sampling.n = 2;
    v.push_back(sampled("cold", 10, c));
    v.back().sampling.temperature = 0.3f;
    return v;
  };
  Outcome base = run(config(0), reqs);
  for (const char* method : {"mtp", "ngram"})
    for (const char* gating : {"fixed", "cost", "confidence"}) {
      SCOPED_TRACE(std::string(method) + " " + gating);
      EngineStats st;
      const Outcome o = run(config(2, 64, gating, method), reqs, &st);
      EXPECT_EQ(o.tokens, base.tokens);
      EXPECT_EQ(o.finish, base.finish);
      if (std::string(gating) != "fixed") {  // the gate's choices follow timing; the tokens do not
        EXPECT_EQ(run(config(2, 64, gating, method), reqs).tokens, o.tokens) << "seeded: the same run to run";
      }
      EXPECT_GT(st.spec_draft_tokens, 0);
      EXPECT_GT(st.spec_accepted_tokens, 0);
    }
  // Sampled requests alone: their own drafts are verified and accepted (MTP, fixed K = 2).
  auto only_sampled = [&](Collector& c) {
    std::vector<EngineRequest> v = reqs(c);
    v.erase(v.begin());  // "g"
    return v;
  };
  EngineStats st;
  const Outcome o = run(config(2), only_sampled, &st);
  base.tokens.erase("g");
  EXPECT_EQ(o.tokens, base.tokens);
  EXPECT_GT(st.spec_drafts, 20);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);
  // top_k 1 at temperature 0.8 speculates and gives the greedy tokens without speculation.
  auto top1 = [&](Collector& c) {
    EngineRequest r = sampled("k1", 11, c);
    r.sampling.top_k = 1;
    return std::vector<EngineRequest>{std::move(r)};
  };
  auto greedy_ref = [&](Collector& c) {
    return std::vector<EngineRequest>{greedy("k1", prompt(20, 11), 32, c)};
  };
  EngineStats st1;
  EXPECT_EQ(run(config(2), top1, &st1).tokens, run(config(0), greedy_ref).tokens);
  EXPECT_GT(st1.spec_accepted_tokens, 0);
}

// With a device sampler (reference_sample_rows.h: the host sampler's arithmetic "on the device"), a step
// that verifies drafts samples every verify row there and accepts the drafts while they equal the
// draws: the tokens are the host's without speculation (greedy, sampled with top_p / top_k / min_p,
// n = 2), drafts are accepted, and no step goes to the host sampler (before, every verifying step did).
TEST_F(SpecDecodeTest, SampledVerificationOnTheDeviceSampler) {
  auto reqs = [&](Collector& c) {
    std::vector<EngineRequest> v{greedy("g", prompt(20, 4), 30, c)};
    auto add = [&](const std::string& id, int seed, float temperature) {
      v.push_back(greedy(id, prompt(20, seed), 32, c));
      v.back().sampling.temperature = temperature;
      v.back().sampling.seed = uint64_t(seed);
    };
    add("t", 5, 0.8f);
    add("top_p", 6, 0.8f);
    v.back().sampling.top_p = 0.9f;
    add("top_k", 7, 0.8f);
    v.back().sampling.top_k = 20;
    add("min_p", 8, 1.2f);
    v.back().sampling.min_p = 0.05f;
    add("n2", 9, 0.8f);
    v.back().sampling.n = 2;
    return v;
  };
  EngineStats host_st;
  const Outcome base = run(config(0), reqs, &host_st);
  auto sampler = std::make_unique<engine_test::ReferenceSampleRows>();
  const engine_test::ReferenceSampleRows* rs = sampler.get();
  model_->set_sampler(std::move(sampler));
  EngineStats st;
  const Outcome o = run(config(2), reqs, &st);
  const int calls = rs->calls;
  model_->set_sampler(nullptr);
  EXPECT_EQ(o.tokens, base.tokens);
  EXPECT_GT(calls, 0);
  EXPECT_GT(st.spec_drafts, 20);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  EXPECT_LT(st.spec_accepted_tokens, st.spec_draft_tokens);
  EXPECT_EQ(st.steps_host_sampled, 0);
  EXPECT_GT(host_st.steps_host_sampled, 0);
}

// "synthetic_acceptance" (benchmarks): P = 0 rejects every draft (the output stays the model's), P = 1
// accepts every one.
TEST_F(SpecDecodeTest, SyntheticAcceptanceFixesTheRate) {
  auto reqs = [&](Collector& c) { return std::vector<EngineRequest>{greedy("s", prompt(16, 6), 30, c)}; };
  const Outcome base = run(config(0), reqs);
  for (double p : {0.0, 1.0}) {
    EngineConfig ec = config(2);
    ec.speculative.synthetic_acceptance = p;
    EngineStats st;
    const Outcome o = run(ec, reqs, &st);
    ASSERT_GT(st.spec_draft_tokens, 0);
    EXPECT_EQ(st.spec_accepted_tokens, p == 0 ? 0 : st.spec_draft_tokens) << p;
    EXPECT_EQ(o.tokens.at("s").at(0).size(), 30u);
    if (p == 0) {
      EXPECT_EQ(o.tokens, base.tokens);
    }
  }
}

// Steps the gate plans plain (no MTP pass, no verify rows) are launched early, before the step ahead
// is applied, as on a server without speculation; drafting steps never are. Drafts always rejected
// (synthetic acceptance 0) make drafting lose every probe, so after the first cycle's drafting probes
// the gate runs plain. Greedy output stays the plain engine's, and the same with early launch off.
// (Greedy rows: on the CPU sampled rows sample on the host, which no early step does.)
TEST_F(SpecDecodeTest, PlainStepsOfASpeculatingEngineLaunchEarly) {
  auto reqs = [&](Collector& c) {
    std::vector<EngineRequest> v;
    for (int i = 0; i < 4; ++i) v.push_back(greedy(name("g", i), prompt(20 + 9 * i, i), 120, c));
    return v;
  };
  EngineStats base_st;
  const Outcome base = run(config(0), reqs, &base_st);
  EXPECT_GT(base_st.steps_early, 0);
  for (bool early : {true, false}) {
    SCOPED_TRACE(early ? "early launch" : "early launch off");
    EngineConfig ec = config(2, 64, "confidence");
    ec.speculative.synthetic_acceptance = 0;
    ec.early_launch = early;
    EngineStats st;
    const Outcome o = run(ec, reqs, &st);
    EXPECT_EQ(o.tokens, base.tokens);
    EXPECT_GT(st.spec_draft_tokens, 0) << "the drafting probes";
    if (early) {
      EXPECT_GT(st.steps_early, st.steps / 4) << st.steps << " steps";
    } else {
      EXPECT_EQ(st.steps_early, 0);
    }
  }
}

TEST(SpecConfigTest, ParsesVllmSpellingAndRefusesBadInput) {
  SpecConfig c = parse_spec_config(R"({"method":"deepseek_mtp","num_speculative_tokens":3})");
  EXPECT_EQ(c.method, SpecConfig::Method::kMtp);
  EXPECT_EQ(c.num_speculative_tokens, 3);
  EXPECT_LT(c.synthetic_acceptance, 0);
  c = parse_spec_config(R"({"method":"mtp","num_speculative_tokens":1,"synthetic_acceptance":0.75})");
  EXPECT_DOUBLE_EQ(c.synthetic_acceptance, 0.75);
  auto refuses = [](const std::string& j, const std::string& words) {
    try {
      parse_spec_config(j);
      ADD_FAILURE() << j << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refuses("{", "not valid JSON");
  refuses("[]", "JSON object");
  refuses(R"({"method":"eagle","num_speculative_tokens":1})", "unknown method");
  refuses(R"({"method":"ngram","num_speculative_tokens":1,"prompt_lookup_min":4,"prompt_lookup_max":2})",
          "must not exceed");
  refuses(R"({"method":"ngram","num_speculative_tokens":1,"prompt_lookup_max":0})", "from 1 to 32");
  refuses(R"({"method":"mtp","num_speculative_tokens":1,"prompt_lookup_max":3})", "\"ngram\" only");
  refuses(R"({"method":"mtp"})", "num_speculative_tokens");
  refuses(R"({"method":"mtp","num_speculative_tokens":0})", "from 1 to 8");
  refuses(R"({"method":"mtp","num_speculative_tokens":2.5})", "from 1 to 8");
  refuses(R"({"num_speculative_tokens":2})", "\"method\" is required");
  refuses(R"({"method":"mtp","num_speculative_tokens":1,"synthetic_acceptance":2})", "[0, 1]");
  refuses(R"({"method":"mtp","num_speculative_tokens":1,"draft_model":"x"})", "unknown key");
  refuses(R"({"method":"mtp","num_speculative_tokens":1,"gating":"confident"})",
          "\"confidence\", \"cost\" or \"fixed\"");
  EXPECT_EQ(c.gating, SpecGate::Mode::kConfidence);  // the default
  auto gating = [](const char* g) {
    return parse_spec_config(std::string(R"({"method":"mtp","num_speculative_tokens":1,"gating":")") + g +
                             "\"}")
        .gating;
  };
  EXPECT_EQ(gating("fixed"), SpecGate::Mode::kFixed);
  EXPECT_EQ(gating("cost"), SpecGate::Mode::kCost);
  EXPECT_EQ(gating("confidence"), SpecGate::Mode::kConfidence);
}

// "ngram" takes vLLM's defaults: a lookup length given alone sets the other; neither gives 5 and 5.
TEST(SpecConfigTest, NgramLookupLengthsDefaultAsVllm) {
  SpecConfig c = parse_spec_config(R"({"method":"ngram","num_speculative_tokens":3})");
  EXPECT_EQ(c.method, SpecConfig::Method::kNgram);
  EXPECT_EQ(c.prompt_lookup_min, 5);
  EXPECT_EQ(c.prompt_lookup_max, 5);
  c = parse_spec_config(R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4})");
  EXPECT_EQ(c.prompt_lookup_min, 4);
  EXPECT_EQ(c.prompt_lookup_max, 4);
  c = parse_spec_config(
      R"({"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":2,"prompt_lookup_max":4})");
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_EQ(c.prompt_lookup_max, 4);
}

// A model without MTP layers (the dsv3-tiny fixture) cannot speculate with "mtp".
// The dsv3-tiny fixture: a DeepSeek-V3 model without MTP layers.
struct TinyModel {
  std::string dir = std::string(BELUGA_SOURCE_DIR) + "/tests/fixtures/dsv3-tiny";
  ModelConfig cfg = ModelConfig::from_file(dir + "/config.json");
  Checkpoint ckpt{dir};
  CpuOps ops{CpuOptions{1}};
  std::unique_ptr<Model> model = load_model(cfg, ckpt, ops, 256);
};

TEST(SpecConfigTest, ModelWithoutMtpIsRefused) {
  TinyModel tiny;
  Model* model = tiny.model.get();
  EXPECT_FALSE(model->has_mtp());
  EngineConfig ec;
  ec.num_kv_blocks = 8;
  ec.speculative = parse_spec_config(R"({"method":"mtp","num_speculative_tokens":1})");
  try {
    Engine e(*model, ec);
    ADD_FAILURE() << "an engine speculating without an MTP module was built";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MTP module"), std::string::npos) << e.what();
  }
}

// Prompt lookup on a model without an MTP module (dsv3-tiny): it builds and keeps greedy output.
TEST(SpecConfigTest, NgramNeedsNoMtpModule) {
  TinyModel tiny;
  Model* model = tiny.model.get();
  ASSERT_FALSE(model->has_mtp());
  std::map<int, std::vector<int>> out[2];
  for (int spec = 0; spec < 2; ++spec) {
    EngineConfig ec;
    ec.num_kv_blocks = 32;
    if (spec)
      ec.speculative =
          parse_spec_config(R"({"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":2})");
    Engine e(*model, ec);
    Collector c;
    EngineRequest r;
    r.id = "t";
    r.prompt = {1, 5, 9, 13, 5, 9, 13, 5, 9};
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 16;
    r.sampling.ignore_eos = true;
    r.on_output = c.callback();
    ASSERT_EQ(e.submit(std::move(r)), SubmitStatus::kOk);
    ASSERT_TRUE(c.wait(1));
    std::lock_guard<std::mutex> lk(c.mu);
    EXPECT_EQ(c.error["t"], "") << "spec=" << spec;
    out[spec] = c.tokens["t"];
  }
  EXPECT_EQ(out[1], out[0]);
  EXPECT_EQ(out[0].at(0).size(), 16u);
}

}  // namespace
}  // namespace beluga
