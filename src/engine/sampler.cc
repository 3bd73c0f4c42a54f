#include "engine/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "util/mix.h"

namespace beluga {

namespace {

// log-softmax of the raw logits, for logprobs.
void log_softmax(const float* x, int n, std::vector<float>& out) {
  out.resize(size_t(n));
  const float mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i] - mx));
  const float lse = mx + float(std::log(sum));
  for (int i = 0; i < n; ++i) out[size_t(i)] = x[i] - lse;
}

// The entry of `token` given `lp` (log-softmax over the vocabulary): its rank as vLLM counts it (the
// tokens at least as likely, itself included) and the top k, best first (ties: the lower id).
TokenLogprob logprob_entry(const std::vector<float>& lp, int vocab, int token, int k, std::vector<int>& idx) {
  TokenLogprob t;
  t.token = token;
  t.logprob = lp[size_t(token)];
  t.rank = int(std::count_if(lp.begin(), lp.begin() + vocab, [&](float x) { return x >= t.logprob; }));
  k = std::min(k, vocab);
  if (k > 0) {
    idx.resize(size_t(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
      return lp[size_t(a)] > lp[size_t(b)] || (lp[size_t(a)] == lp[size_t(b)] && a < b);
    });
    t.top.reserve(size_t(k));
    for (int i = 0; i < k; ++i) t.top.emplace_back(idx[size_t(i)], lp[size_t(idx[size_t(i)])]);
  }
  return t;
}

// Per-thread scratch for candidate probabilities (the engine samples on one thread).
std::vector<double>& prob_scratch(int n) {
  thread_local std::vector<double> v;
  if (v.size() < size_t(n)) v.resize(size_t(n));
  return v;
}

}  // namespace

bool samples_raw_argmax(const SampleContext& ctx) {
  const SamplingParams& p = *ctx.params;
  return !ctx.allowed && p.temperature <= 0.0f && p.logprobs < 0 && p.logit_bias.empty() &&
         p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         (ctx.num_output >= p.min_tokens || ctx.stop_ids->empty());
}

double sample_uniform(uint64_t seed, int seq_index, int step) {
  return unit_double(seed ^ mix64(uint64_t(seq_index) * 0x100000001b3ull + uint64_t(step)));
}

SampleResult sample(float* logits, int vocab, const SampleContext& ctx, std::vector<float>& scratch,
                    std::vector<int>& idx) {
  const SamplingParams& p = *ctx.params;
  SampleResult r{};
  if (p.logprobs >= 0) log_softmax(logits, vocab, scratch);

  for (const auto& [tok, bias] : p.logit_bias)
    if (tok >= 0 && tok < vocab) logits[tok] += bias;
  if (p.repetition_penalty != 1.0f) {
    auto penalize = [&](int t) {
      if (t < 0 || t >= vocab) return;
      logits[t] = logits[t] > 0 ? logits[t] / p.repetition_penalty : logits[t] * p.repetition_penalty;
    };
    std::vector<int> seen(*ctx.prompt);
    for (const auto& [t, c] : *ctx.output_counts) seen.push_back(t);
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (int t : seen) penalize(t);
  }
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f)
    for (const auto& [t, c] : *ctx.output_counts)
      if (t >= 0 && t < vocab) logits[t] -= p.presence_penalty + p.frequency_penalty * float(c);
  if (ctx.num_output < p.min_tokens)
    for (int t : *ctx.stop_ids)
      if (t >= 0 && t < vocab) logits[t] = -INFINITY;
  if (ctx.allowed) {  // after every other edit, so nothing can bring a disallowed token back
    bool any = false;
    for (int t = 0; t < vocab; ++t) {
      if (!((ctx.allowed[t >> 5] >> (t & 31)) & 1))
        logits[t] = -INFINITY;
      else
        any = any || logits[t] > -INFINITY;
    }
    // The grammar is complete and only a stop token may follow, but min_tokens masked it: the
    // grammar wins (the caller guarantees the mask is not empty).
    if (!any)
      for (int t : *ctx.stop_ids)
        if (t >= 0 && t < vocab && ((ctx.allowed[t >> 5] >> (t & 31)) & 1)) logits[t] = 0.0f;
  }

  int token;
  if (p.temperature <= 0.0f) {
    token = int(std::max_element(logits, logits + vocab) - logits);
  } else {
    // Candidates by descending logit: all of them, or the top_k. Sorting is needed only when a
    // filter looks at ranks (top_k, top_p, min_p).
    idx.resize(size_t(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    const int k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
    auto by_logit = [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    if (k < vocab)
      std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), by_logit);
    else if (p.top_p < 1.0f || p.min_p > 0.0f)
      std::sort(idx.begin(), idx.end(), by_logit);
    float mx = -INFINITY;
    for (int i = 0; i < k; ++i) mx = std::max(mx, logits[idx[size_t(i)]]);
    std::vector<double>& prob = prob_scratch(k);
    double sum = 0;
    for (int i = 0; i < k; ++i)
      sum += (prob[size_t(i)] = std::exp(double(logits[idx[size_t(i)]] - mx) / p.temperature));
    int keep = k;
    if (p.top_p < 1.0f) {
      double acc = 0;
      for (int i = 0; i < k; ++i) {
        acc += prob[size_t(i)] / sum;
        if (acc >= p.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    if (p.min_p > 0.0f) {
      const double floor = p.min_p * prob[0];  // prob[0] is the most likely (sorted)
      int i = 1;
      while (i < keep && prob[size_t(i)] >= floor) ++i;
      keep = i;
    }
    double kept = 0;
    for (int i = 0; i < keep; ++i) kept += prob[size_t(i)];
    const double u = sample_uniform(ctx.seed, ctx.seq_index, ctx.num_output) * kept;
    double acc = 0;
    token = idx[size_t(keep - 1)];
    for (int i = 0; i < keep; ++i) {
      acc += prob[size_t(i)];
      if (u < acc) {
        token = idx[size_t(i)];
        break;
      }
    }
  }
  r.token = token;
  if (p.logprobs >= 0) r.logprob = logprob_entry(scratch, vocab, token, p.logprobs, idx);
  return r;
}

TokenLogprob token_logprob(const float* logits, int vocab, int token, int k, std::vector<float>& scratch,
                           std::vector<int>& idx) {
  log_softmax(logits, vocab, scratch);
  return logprob_entry(scratch, vocab, token, k, idx);
}

}  // namespace beluga
