// A scripted engine for server tests: each request's sequences emit the tokens of a fixed text
// (chosen per request by a callback), one token per step, then finish with kStop (or kLength at
// max_tokens). Records aborts and prompts; can be told to refuse submissions (queue full). With
// sampling.logprobs >= 0 each token carries fake_logprob(pos) and, for k > 0, the top k
// alternatives fake_top(token, pos, k) (the chosen token first, then token+1, token+2, ...). With
// sampling.prompt_logprobs >= 0 the first output carries fake_prompt_logprob(prompt, i, k) for each
// prompt token i >= 1.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "server/engine_handle.h"

namespace beluga::server::testing {

inline float fake_logprob(size_t pos) {
  return -0.25f * float(pos % 7) - 0.125f;
}
inline std::vector<std::pair<int, float>> fake_top(int token, size_t pos, int k) {
  std::vector<std::pair<int, float>> top;
  for (int i = 0; i < k; ++i) top.emplace_back(token + i, fake_logprob(pos) - float(i));
  return top;
}

// Prompt token i's entry: logprob -1 - i/8, rank i % 3 + 1, top k alternatives of its own (token+1,
// token+2, ...: the prompt token itself is not among them).
inline TokenLogprob fake_prompt_logprob(const std::vector<int>& prompt, size_t i, int k) {
  TokenLogprob t;
  t.token = prompt[i];
  t.logprob = -1.0f - 0.125f * float(i);
  t.rank = int(i % 3) + 1;
  for (int j = 0; j < k; ++j) t.top.emplace_back(prompt[i] + 1 + j, -0.5f - float(j));
  return t;
}

class FakeEngine final : public EngineHandle {
 public:
  // tokens_for(request) -> the ids every sequence of it generates.
  explicit FakeEngine(std::function<std::vector<int>(const EngineRequest&)> tokens_for,
                      std::chrono::milliseconds step = std::chrono::milliseconds(1))
      : tokens_for_(std::move(tokens_for)), step_(step), thread_([this] { loop(); }) {}
  ~FakeEngine() override {
    {
      std::lock_guard l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  SubmitStatus submit(EngineRequest req, std::string* why) override {
    std::lock_guard l(mu_);
    if (throw_on_submit_) throw std::runtime_error("fake engine: submit failed (injected)");
    if (refuse_) return SubmitStatus::kQueueFull;
    submitted_.push_back(req.id);
    salts_.push_back(req.cache_salt);
    classes_.push_back(req.traffic_class);
    prompts_.push_back(req.prompt);
    last_sampling_ = req.sampling;
    Active a;
    a.tokens = tokens_for_(req);
    a.req = std::move(req);
    active_.push_back(std::move(a));
    cv_.notify_all();
    return SubmitStatus::kOk;
  }
  void abort(const std::string& id) override {
    std::lock_guard l(mu_);
    aborted_.insert(id);
    cv_.notify_all();
  }
  EngineStats stats() const override {
    std::lock_guard l(mu_);
    EngineStats s;
    s.running = int(active_.size()) + processing_;
    s.kv_blocks_total = 100;
    s.kv_blocks_used = s.running;
    s.steps = steps_;
    s.steps_failed = steps_failed_;
    return s;
  }
  int max_model_len() const override { return 512; }

  void set_refuse(bool r) {
    std::lock_guard l(mu_);
    refuse_ = r;
  }
  // submit() throws std::runtime_error (a handler exception in the server).
  void set_throw_on_submit(bool t) {
    std::lock_guard l(mu_);
    throw_on_submit_ = t;
  }
  // Adds to the step counters stats() reports (the fake's own loop does not count steps).
  void add_steps(int64_t steps, int64_t failed) {
    std::lock_guard l(mu_);
    steps_ += steps;
    steps_failed_ += failed;
  }
  std::set<std::string> aborted() const {
    std::lock_guard l(mu_);
    return aborted_;
  }
  std::vector<std::string> salts() const {
    std::lock_guard l(mu_);
    return salts_;
  }
  std::vector<std::string> traffic_classes() const {  // of every submitted request, in order
    std::lock_guard l(mu_);
    return classes_;
  }
  // Prompt token ids of every submitted request, in submission order.
  std::vector<std::vector<int>> prompts() const {
    std::lock_guard l(mu_);
    return prompts_;
  }
  SamplingParams last_sampling() const {
    std::lock_guard l(mu_);
    return last_sampling_;
  }
  int active() const {
    std::lock_guard l(mu_);
    return int(active_.size()) + processing_;
  }
  size_t submitted_count() const {
    std::lock_guard l(mu_);
    return submitted_.size();
  }

 private:
  struct Active {
    EngineRequest req;
    std::vector<int> tokens;
    size_t pos = 0;
  };

  void loop() {
    std::unique_lock l(mu_);
    while (!stop_) {
      cv_.wait_for(l, step_);
      std::vector<Active> cur, keep;
      cur.swap(active_);
      processing_ = int(cur.size());
      for (auto& a : cur) {
        RequestOutput o;
        o.request_id = a.req.id;
        o.prompt_tokens = int(a.req.prompt.size());
        o.cached_tokens = 0;
        if (a.pos == 0 && a.req.sampling.prompt_logprobs >= 0)
          for (size_t i = 1; i < a.req.prompt.size(); ++i)
            o.prompt_logprobs.push_back(fake_prompt_logprob(a.req.prompt, i, a.req.sampling.prompt_logprobs));
        const bool aborted = aborted_.count(a.req.id) > 0;
        const int n = std::max(1, a.req.sampling.n);
        const bool length = int(a.pos) + 1 >= a.req.sampling.max_tokens && a.pos + 1 < a.tokens.size();
        const bool last = a.pos + 1 >= a.tokens.size() || length;
        for (int i = 0; i < n; ++i) {
          SeqOutput s;
          s.index = i;
          if (aborted) {
            s.finish = FinishReason::kAbort;
          } else {
            if (a.pos < a.tokens.size()) {
              s.tokens.push_back(a.tokens[a.pos]);
              if (a.req.sampling.logprobs >= 0)
                s.logprobs.push_back(TokenLogprob{a.tokens[a.pos], fake_logprob(a.pos),
                                                  fake_top(a.tokens[a.pos], a.pos, a.req.sampling.logprobs)});
            }
            if (last) s.finish = length ? FinishReason::kLength : FinishReason::kStop;
          }
          o.seqs.push_back(std::move(s));
        }
        o.finished = aborted || last;
        ++a.pos;
        auto cb = a.req.on_output;
        l.unlock();
        cb(std::move(o));
        l.lock();
        if (!aborted && !last) keep.push_back(std::move(a));
      }
      for (auto& a : active_) keep.push_back(std::move(a));  // submitted during the step
      active_.swap(keep);
      processing_ = 0;
    }
  }

  std::function<std::vector<int>(const EngineRequest&)> tokens_for_;
  std::chrono::milliseconds step_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Active> active_;
  std::set<std::string> aborted_;
  std::vector<std::string> submitted_, salts_, classes_;
  std::vector<std::vector<int>> prompts_;
  SamplingParams last_sampling_;
  int processing_ = 0;
  bool refuse_ = false, stop_ = false, throw_on_submit_ = false;
  int64_t steps_ = 0, steps_failed_ = 0;
  std::thread thread_;
};

}  // namespace beluga::server::testing
