// Structured output through the engine (the logits-processor seam, engine/logits_processor.h): the
// demo model, sampled at temperature 1 with n = 2, under JSON Schema grammars. Every sequence that
// finishes with `stop` must be a complete, valid instance (checked by a fresh matcher and by parsing
// the JSON and checking the schema's constraints directly); one cut by max_tokens must be a prefix the
// grammar allows. The same request unconstrained does not fit the schema (checked too).
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>

#include "backend/cpu/cpu_ops.h"
#include "engine/engine.h"
#include "grammar/check.h"
#include "grammar/grammar_processor.h"
#include "grammar/matcher.h"
#include "loader/weight_source.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace beluga::grammar {
namespace {

struct Outputs {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::map<int, std::vector<int>>> tokens;
  std::map<std::string, std::map<int, FinishReason>> finish;
  std::map<std::string, std::string> error;
  int done = 0;
  OutputCallback callback() {
    return [this](RequestOutput&& o) {
      std::lock_guard<std::mutex> lk(mu);
      for (auto& s : o.seqs) {
        auto& v = tokens[o.request_id][s.index];
        v.insert(v.end(), s.tokens.begin(), s.tokens.end());
        if (s.finish != FinishReason::kNone) finish[o.request_id][s.index] = s.finish;
      }
      if (!o.error.empty()) error[o.request_id] = o.error;
      if (o.finished) ++done;
      cv.notify_all();
    };
  }
  bool wait(int n) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(300), [&] { return done >= n; });
  }
};

class ConstrainedEngine : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::string(BELUGA_SOURCE_DIR) + "/models/beluga-demo-coder-mtp";
    cfg_ = ModelConfig::from_file(dir_ + "/config.json");
    ckpt_ = std::make_unique<Checkpoint>(dir_);
    ops_ = std::make_unique<CpuOps>(CpuOptions{2});
    model_ = load_model(cfg_, *ckpt_, *ops_, 1024);
    tok_ = std::make_unique<tok::Tokenizer>(tok::Tokenizer::from_file(dir_ + "/tokenizer.json"));
    vocab_ = std::make_shared<TokenVocab>(*tok_, cfg_.eos_token_ids);
  }
  std::string dir_;
  ModelConfig cfg_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<CpuOps> ops_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<tok::Tokenizer> tok_;
  std::shared_ptr<TokenVocab> vocab_;
};

TEST_F(ConstrainedEngine, SampledOutputsFollowTheSchema) {
  const char* schema_text = R"({"type":"object","properties":{
      "name":{"type":"string","maxLength":12},
      "count":{"type":"integer","minimum":0,"maximum":99},
      "tags":{"type":"array","items":{"enum":["a","b","c"]},"maxItems":3}},
    "required":["name","count"],"additionalProperties":false})";
  auto schema = nlohmann::ordered_json::parse(schema_text);
  auto g = compile_json_schema(schema, vocab_, {}, std::chrono::milliseconds(10'000));
  EngineConfig ec;
  ec.max_num_seqs = 8;
  Engine engine(*model_, ec);
  Outputs out;
  constexpr int kRequests = 4;
  for (int i = 0; i < kRequests; ++i) {
    EngineRequest r;
    r.id = "r";
    r.id += std::to_string(i);
    r.prompt = tok_->encode("def describe(item):\n    return ", false);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 1234 + i;
    r.sampling.n = 2;
    r.sampling.max_tokens = 120;
    r.logits_processor = processor_factory(g);
    r.on_output = out.callback();
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  }
  {
    EngineRequest r;  // the same as r0, unconstrained: shows the constraint is what makes it JSON
    r.id = "free";
    r.prompt = tok_->encode("def describe(item):\n    return ", false);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 1234;
    r.sampling.max_tokens = 120;
    r.on_output = out.callback();
    ASSERT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
  }
  ASSERT_TRUE(out.wait(kRequests + 1));
  {
    Matcher m(g);
    std::string free_text = tok_->decode(out.tokens["free"][0]);
    EXPECT_FALSE(m.accept_bytes(free_text) && m.is_accepting()) << "unconstrained output fits: " << free_text;
    out.tokens.erase("free");
  }
  int stopped = 0;
  for (auto& [id, seqs] : out.tokens) {
    EXPECT_EQ(out.error.count(id), 0u) << out.error[id];
    for (auto& [k, ids] : seqs) {
      std::string text = tok_->decode(ids);
      Matcher m(g);
      bool prefix_ok = true;
      for (int t : ids) prefix_ok = prefix_ok && m.accept_token(t);
      EXPECT_TRUE(prefix_ok) << id << "/" << k << ": " << text;
      if (out.finish[id][k] != FinishReason::kStop) continue;
      ++stopped;
      EXPECT_TRUE(m.is_accepting()) << text;
      auto j = nlohmann::ordered_json::parse(text);  // throws (fails the test) if not JSON
      ASSERT_TRUE(j.is_object()) << text;
      ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
      // An integer in JSON Schema 2020-12: any number with a zero fractional part (0.0 included).
      ASSERT_TRUE(j.contains("count") && j["count"].is_number()) << text;
      double count = j["count"].get<double>();
      EXPECT_EQ(count, std::floor(count)) << text;
      EXPECT_LE(count, 99) << text;
      EXPECT_GE(count, 0) << text;
      for (auto& [key, v] : j.items()) EXPECT_TRUE(key == "name" || key == "count" || key == "tags") << text;
    }
  }
  std::printf("%d of %d sequences finished with stop\n", stopped, 2 * kRequests);
}

// Fails its sequence's mask from the `fail_at`-th fill on (the grammar state is then beyond repair).
class FailingProcessor final : public LogitsProcessor {
 public:
  FailingProcessor(std::unique_ptr<LogitsProcessor> inner, int fail_at)
      : inner_(std::move(inner)), fail_at_(fail_at) {}
  void fill_mask(uint32_t* m, int vocab) override {
    if (++fills_ >= fail_at_) throw Error("injected mask failure");
    inner_->fill_mask(m, vocab);
  }
  void accept(int t) override { inner_->accept(t); }
  void rollback(int n) override { inner_->rollback(n); }
  bool is_accepting() const override { return inner_->is_accepting(); }

 private:
  std::unique_ptr<LogitsProcessor> inner_;
  int fail_at_, fills_ = 0;
};

// Masks filled by worker threads (EngineConfig::mask_threads) give the tokens the engine thread alone
// gives: 6 constrained requests x n = 2 sampled at temperature 1 with seeds, one of them failing its
// mask mid-way (that request alone errors, at the same point).
TEST_F(ConstrainedEngine, ParallelMasksGiveTheSameOutputs) {
  auto schema = nlohmann::ordered_json::parse(
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":10},
          "n":{"type":"integer","minimum":0,"maximum":999}},"required":["name","n"]})");
  auto g = compile_json_schema(schema, vocab_, {}, std::chrono::milliseconds(10'000));
  auto run = [&](int threads) {
    EngineConfig ec;
    ec.max_num_seqs = 16;
    ec.mask_threads = threads;
    Engine engine(*model_, ec);
    auto out = std::make_unique<Outputs>();
    constexpr int kRequests = 6;
    for (int i = 0; i < kRequests; ++i) {
      EngineRequest r;
      r.id = "r" + std::to_string(i);
      r.prompt = tok_->encode("item = ", false);
      r.sampling.temperature = 1.0f;
      r.sampling.seed = 77 + i;
      r.sampling.n = 2;
      r.sampling.max_tokens = 24;
      if (i == 3) {
        r.logits_processor = [g] { return std::make_unique<FailingProcessor>(processor_factory(g)(), 6); };
      } else {
        r.logits_processor = processor_factory(g);
      }
      r.on_output = out->callback();
      EXPECT_EQ(engine.submit(std::move(r)), SubmitStatus::kOk);
    }
    EXPECT_TRUE(out->wait(kRequests));
    return out;
  };
  auto alone = run(0), parallel = run(3);
  EXPECT_EQ(alone->tokens, parallel->tokens);
  EXPECT_EQ(alone->finish, parallel->finish);
  EXPECT_EQ(alone->error, parallel->error);
  for (const auto& [id, seqs] : parallel->tokens) {
    for (const auto& [k, ids] : seqs) {
      if (id == "r3") {
        EXPECT_EQ(ids.size(), 5u) << "five tokens, then the sixth mask fails";
        EXPECT_EQ(parallel->finish[id][k], FinishReason::kError);
        continue;
      }
      Matcher m(g);
      for (int t : ids) EXPECT_TRUE(m.accept_token(t)) << id << "/" << k;
    }
  }
}

}  // namespace
}  // namespace beluga::grammar
