// Deterministic mode (EngineConfig::deterministic + CpuOptions::deterministic): one probe request gives
// bit-identical token ids and logprobs alone and inside batches of 1, 8 and 64 mixed requests, with
// chunked prefill (a small --max-num-batched-tokens) and with prefix-cache hits, greedy and sampled,
// on the demo model (MLA + MoE, BF16 weights) and the dsv2-lite-tiny fixture (MoE).
#include <gtest/gtest.h>

#include <bit>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "engine/engine.h"
#include "loader/weight_source.h"
#include "model/batch.h"

namespace beluga {
namespace {

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

class DeterministicTest : public ::testing::TestWithParam<std::string> {
 protected:
  void load(bool deterministic) {
    const std::string dir = std::string(BELUGA_SOURCE_DIR) + "/" + GetParam();
    cfg_ = ModelConfig::from_file(dir + "/config.json");
    ckpt_ = std::make_unique<Checkpoint>(dir);
    CpuOptions o;
    o.threads = 2;
    o.deterministic = deterministic;
    ops_ = std::make_unique<CpuOps>(o);
    model_ = load_model(cfg_, *ckpt_, *ops_, 1024);
    deterministic_ = deterministic;
  }
  std::vector<int> tokens(int n, int seed) const {
    std::vector<int> p(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) p[size_t(i)] = 2 + (i * 131 + seed * 977) % (cfg_.vocab_size - 2);
    return p;
  }
  EngineRequest request(const std::string& id, std::vector<int> prompt, bool sampled, int max_tokens,
                        Outputs& out) const {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.sampling.temperature = sampled ? 0.9f : 0.0f;
    if (sampled) r.sampling.top_p = 0.95f;  // no seed: the mode's seed 0
    r.sampling.logprobs = 3;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    r.on_output = out.callback();
    return r;
  }
  // The probe, submitted last after `others` mixed requests (greedy and sampled, seeded and not, prompt
  // lengths 3..90, half of them sharing the probe's first 64 tokens: one KV block), in an engine with
  // `budget` batched tokens per step. With `warm`, the probe runs once before the batch, so the batch's probe
  // starts from a prefix-cache hit.
  Trace run(const Probe& probe, int others, int budget, bool warm = false) {
    EngineConfig ec;
    ec.num_kv_blocks = 512;
    ec.max_num_seqs = 64;
    ec.max_num_batched_tokens = budget;
    ec.deterministic = deterministic_;
    Engine engine(*model_, ec);
    Outputs out;
    int expect = 0;
    if (warm) {
      EXPECT_EQ(engine.submit(request("warm", probe.prompt, probe.sampled, 12, out)), SubmitStatus::kOk);
      EXPECT_TRUE(out.wait(++expect));
    }
    for (int i = 0; i < others; ++i) {
      std::vector<int> p = tokens(3 + (i * 37) % 88, 100 + i);
      if (i % 2 == 0) {
        std::vector<int> shared(probe.prompt.begin(), probe.prompt.begin() + kKvBlockSize);
        shared.insert(shared.end(), p.begin(), p.end());
        p = std::move(shared);
      }
      EngineRequest r = request("other" + std::to_string(i), std::move(p), i % 3 != 0, 4 + i % 13, out);
      if (i % 4 == 1) r.sampling.seed = uint64_t(i);
      if (i % 5 == 2) r.sampling.top_k = 20;
      EXPECT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
    }
    expect += others;
    EXPECT_EQ(engine.submit(request("probe", probe.prompt, probe.sampled, 12, out)), SubmitStatus::kOk);
    EXPECT_TRUE(out.wait(++expect));
    std::lock_guard<std::mutex> lk(out.mu);
    // Every full block of the prompt but one that leaves a token to compute.
    if (warm) {
      EXPECT_EQ(out.seqs["probe"].cached, (int(probe.prompt.size()) - 1) / kKvBlockSize * kKvBlockSize);
    }
    return out.seqs["probe"];
  }

  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<CpuOps> ops_;
  std::unique_ptr<Model> model_;
  bool deterministic_ = false;
};

TEST_P(DeterministicTest, SameIdsAndLogprobsAloneAndInMixedBatches) {
  load(true);
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    const Probe probe{sampled, tokens(150, 7)};
    const Trace alone = run(probe, 0, 2048);
    ASSERT_EQ(alone.ids.size(), 12u);
    ASSERT_EQ(alone.bits.size(), 12u * 7);
    EXPECT_EQ(run(probe, 0, 16), alone) << "chunked prefill, batch of 1";
    EXPECT_EQ(run(probe, 7, 48), alone) << "batch of 8, chunked";
    EXPECT_EQ(run(probe, 63, 256), alone) << "batch of 64, chunked";
    EXPECT_EQ(run(probe, 63, 2048, /*warm=*/true), alone) << "batch of 64, prefix hit";
    EXPECT_EQ(run(probe, 7, 32, /*warm=*/true), alone) << "batch of 8, prefix hit, chunked";
  }
}

TEST_P(DeterministicTest, UnseededRequestsUseSeedZero) {
  load(true);
  const Probe probe{true, tokens(20, 3)};
  const Trace unseeded = run(probe, 0, 2048);
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  ec.deterministic = true;
  Engine engine(*model_, ec);
  Outputs out;
  EngineRequest r = request("probe", probe.prompt, true, 12, out);
  r.sampling.seed = 0;
  ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  ASSERT_TRUE(out.wait(1));
  std::lock_guard<std::mutex> lk(out.mu);
  EXPECT_EQ(out.seqs["probe"], unseeded);
}

TEST_P(DeterministicTest, SpeculativeDecodingIsRefused) {
  load(true);
  EngineConfig ec;
  ec.num_kv_blocks = 128;
  ec.deterministic = true;
  ec.speculative.method = SpecConfig::Method::kMtp;
  ec.speculative.num_speculative_tokens = 1;
  EXPECT_THROW(Engine(*model_, ec), std::exception);
}

INSTANTIATE_TEST_SUITE_P(Models, DeterministicTest,
                         ::testing::Values("models/beluga-demo-coder-mtp", "tests/fixtures/dsv2-lite-tiny"),
                         [](const auto& info) {
                           return info.param.find("demo") != std::string::npos ? std::string("DemoCoder")
                                                                               : std::string("Dsv2LiteTiny");
                         });

}  // namespace
}  // namespace beluga
