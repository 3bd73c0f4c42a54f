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

// Descending value, ties to the lower id: a total order, so partial selection (nth_element, then a
// sort of the front) puts exactly the same ids in exactly the same order as a full sort would.
struct Descending {
  const float* v;
  bool operator()(int a, int b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// Puts the `k` first ids of idx[from, end) in order (by `by`) at idx[from, from + k). A few (k up to
// 256): a heap of k, one comparison for most ids; more: nth_element, then a sort of the front,
// O(n + k log k).
void select_sorted(std::vector<int>& idx, size_t from, size_t k, size_t end, Descending by) {
  const auto first = idx.begin() + ptrdiff_t(from), mid = first + ptrdiff_t(k),
             last = idx.begin() + ptrdiff_t(end);
  if (k <= 256) {
    std::partial_sort(first, mid, last, by);
    return;
  }
  if (mid < last) std::nth_element(first, mid, last, by);
  std::sort(first, mid, by);
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
    select_sorted(idx, 0, size_t(k), size_t(vocab), Descending{lp.data()});
    t.top.reserve(size_t(k));
    for (int i = 0; i < k; ++i) t.top.emplace_back(idx[size_t(i)], lp[size_t(idx[size_t(i)])]);
  }
  return t;
}

// Per-thread vocabulary-sized work space (the engine samples on one thread): candidate
// probabilities by token id, and a bitmask of the tokens already penalized.
struct Work {
  std::vector<double> prob;
  std::vector<uint64_t> seen;
};
Work& work(int vocab) {
  thread_local Work w;
  if (w.prob.size() < size_t(vocab)) w.prob.resize(size_t(vocab));
  if (w.seen.size() < (size_t(vocab) + 63) / 64) w.seen.resize((size_t(vocab) + 63) / 64, 0);
  return w;
}

// Repetition penalty once per distinct token of prompt + output. From the request's distinct prompt
// tokens when the caller keeps them (ctx.prompt_set), else by marking the prompt's tokens in a bitmask
// (cleared again before returning); the output's come from the sequence's running counts.
void repetition_penalty(float* logits, int vocab, const SampleContext& ctx, Work& w) {
  const float rp = ctx.params->repetition_penalty;
  auto penalize = [&](int t) { logits[t] = logits[t] > 0 ? logits[t] / rp : logits[t] * rp; };
  auto valid = [&](int t) { return t >= 0 && t < vocab; };
  if (ctx.prompt_set) {
    for (int t : *ctx.prompt_set)
      if (valid(t)) penalize(t);
    for (const auto& [t, c] : *ctx.output_counts)
      if (valid(t) && !std::binary_search(ctx.prompt_set->begin(), ctx.prompt_set->end(), t)) penalize(t);
    return;
  }
  auto mark = [&](int t) {  // true the first time
    uint64_t& word = w.seen[size_t(t) >> 6];
    const uint64_t bit = uint64_t(1) << (t & 63);
    const bool first = !(word & bit);
    word |= bit;
    return first;
  };
  for (int t : *ctx.prompt)
    if (valid(t) && mark(t)) penalize(t);
  for (const auto& [t, c] : *ctx.output_counts)
    if (valid(t) && mark(t)) penalize(t);
  for (int t : *ctx.prompt)
    if (valid(t)) w.seen[size_t(t) >> 6] = 0;
  for (const auto& [t, c] : *ctx.output_counts)
    if (valid(t)) w.seen[size_t(t) >> 6] = 0;
}

// One draw from the filtered distribution with the step's uniform, walking the candidates idx[0, keep)
// in order.
int draw(const std::vector<int>& idx, int keep, const double* prob, double uniform) {
  double kept = 0;
  for (int i = 0; i < keep; ++i) kept += prob[idx[size_t(i)]];
  const double u = uniform * kept;
  double acc = 0;
  for (int i = 0; i < keep; ++i) {
    acc += prob[idx[size_t(i)]];
    if (u < acc) return idx[size_t(i)];
  }
  return idx[size_t(keep - 1)];
}

// The filters sample_filtered applies (SamplingParams' or a device row's).
struct Filters {
  float temperature, top_p, min_p;
  int top_k;
};

// temperature > 0: top_k, top_p, min_p over the candidates in descending order, then one draw.
// Only the candidates a filter can keep are put in order (partial selection), never the whole
// vocabulary: top_k selects k; top_p sorts a growing front until it holds the nucleus; min_p keeps
// the tokens above its floor (a prefix of the order: probabilities are monotone in the logit).
// The walk order, the kept mass and the single uniform per step are those a full sort gives, so
// the tokens are the same for a seed (up to the rounding of the normalizer, summed in id order).
int sample_filtered(const float* logits, int vocab, const Filters& p, double uniform, std::vector<int>& idx) {
  Work& w = work(vocab);
  double* prob = w.prob.data();  // by token id
  const Descending by{logits};
  idx.resize(size_t(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const int k = (p.top_k > 0 && p.top_k < vocab) ? p.top_k : vocab;
  double sum = 0;
  int limit = vocab;  // candidates idx[0, limit) a filter may keep
  int sorted = 0;     // idx[0, sorted) is in descending order
  if (k < vocab) {
    select_sorted(idx, 0, size_t(k), size_t(vocab), by);
    const float mx = logits[idx[0]];
    for (int i = 0; i < k; ++i) {
      const int t = idx[size_t(i)];
      sum += (prob[t] = std::exp(double(logits[t] - mx) / p.temperature));
    }
    limit = sorted = k;
  } else {
    const float mx = *std::max_element(logits, logits + vocab);
    for (int t = 0; t < vocab; ++t) sum += (prob[t] = std::exp(double(logits[t] - mx) / p.temperature));
    if (p.top_p >= 1.0f && p.min_p <= 0.0f) return draw(idx, vocab, prob, uniform);  // id order, no filter
  }
  if (p.min_p > 0.0f) {
    // The most likely candidate's probability: idx[0] when sorted, else the argmax (exp(0) = 1).
    const double floor = p.min_p * (sorted > 0 ? prob[idx[0]] : 1.0);
    if (sorted > 0) {
      int i = 1;
      while (i < limit && prob[idx[size_t(i)]] >= floor) ++i;
      limit = i;
    } else {
      limit =
          int(std::partition(idx.begin(), idx.end(), [&](int t) { return prob[t] >= floor; }) - idx.begin());
    }
  }
  int keep = limit;
  if (p.top_p < 1.0f) {
    double acc = 0;
    for (int i = 0; i < limit; ++i) {
      if (i == sorted) {  // the nucleus is not in the sorted front yet: sort the next stretch
        const int n = std::min(limit - sorted, std::max(64, sorted));
        select_sorted(idx, size_t(sorted), size_t(n), size_t(limit), by);
        sorted += n;
      }
      acc += prob[idx[size_t(i)]] / sum;
      if (acc >= p.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (sorted < keep) select_sorted(idx, size_t(sorted), size_t(keep - sorted), size_t(limit), by);
  return draw(idx, keep, prob, uniform);
}

// The token of an edited row: the argmax when greedy (ties: the lowest id), else the filtered draw.
int pick(const float* logits, int vocab, const Filters& f, double uniform, std::vector<int>& idx) {
  return f.temperature <= 0.0f ? int(std::max_element(logits, logits + vocab) - logits)
                               : sample_filtered(logits, vocab, f, uniform, idx);
}

}  // namespace

std::vector<int> distinct_tokens(const std::vector<int>& prompt) {
  std::vector<int> v(prompt);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

bool samples_speculatively(const SampleContext& ctx) {
  const SamplingParams& p = *ctx.params;
  return !ctx.allowed && p.logprobs < 0 && p.logit_bias.empty() && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         (ctx.num_output >= p.min_tokens || ctx.stop_ids->empty());
}

bool samples_raw_argmax(const SampleContext& ctx) {
  return ctx.params->temperature <= 0.0f && samples_speculatively(ctx);
}

bool samples_on_device(const SampleContext& ctx) {
  const SamplingParams& p = *ctx.params;
  return p.logprobs <= 0 || (p.logprobs <= kMaxTopLogprobs && !edits_logits(p));
}

bool edits_logits(const SamplingParams& p) {
  return !p.logit_bias.empty() || p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
         p.frequency_penalty != 0.0f;
}

DeviceSampleRow device_sample_row(const SampleContext& ctx, std::vector<DeviceLogitEdit>* edits,
                                  bool reserve_pending) {
  const SamplingParams& p = *ctx.params;
  DeviceSampleRow r;
  r.temperature = p.temperature;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.top_k = p.top_k;
  if (p.temperature > 0.0f) r.u = sample_uniform(ctx.seed, ctx.seq_index, ctx.num_output);
  r.logprob = p.logprobs >= 0 ? 1 : 0;
  r.top_logprobs = std::max(0, p.logprobs);
  if (!edits || !edits_logits(p)) return r;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.edit_begin = int32_t(edits->size());
  const bool rep = p.repetition_penalty != 1.0f,
             counts = p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  for (const auto& [t, b] : p.logit_bias) edits->push_back({t, b, 0, kEditBias});
  if (rep || counts)
    for (const auto& [t, c] : *ctx.output_counts) edits->push_back({t, 0.0f, c, rep ? kEditRepeated : 0u});
  if (rep) {
    if (ctx.prompt_set) {
      for (int t : *ctx.prompt_set) edits->push_back({t, 0.0f, 0, kEditRepeated});
    } else {
      for (int t : *ctx.prompt) edits->push_back({t, 0.0f, 0, kEditRepeated});
    }
  }
  // One entry per token: sorted, the same token's entries merged.
  auto first = edits->begin() + r.edit_begin;
  std::sort(first, edits->end(),
            [](const DeviceLogitEdit& a, const DeviceLogitEdit& b) { return a.token < b.token; });
  auto out = first;
  for (auto it = first; it != edits->end(); ++it) {
    if (out != first && (out - 1)->token == it->token) {
      DeviceLogitEdit& m = *(out - 1);
      m.bias += it->bias;
      m.count += it->count;
      m.flags |= it->flags;
    } else {
      *out++ = *it;
    }
  }
  edits->erase(out, edits->end());
  r.edit_count = int32_t(edits->size()) - r.edit_begin;
  if (reserve_pending) edits->push_back({-1, 0.0f, 0, 0u});
  return r;
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
  if (p.repetition_penalty != 1.0f) repetition_penalty(logits, vocab, ctx, work(vocab));
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

  const double u = p.temperature > 0.0f ? sample_uniform(ctx.seed, ctx.seq_index, ctx.num_output) : 0.0;
  r.token = pick(logits, vocab, Filters{p.temperature, p.top_p, p.min_p, p.top_k}, u, idx);
  if (p.logprobs >= 0) r.logprob = logprob_entry(scratch, vocab, r.token, p.logprobs, idx);
  return r;
}

TokenLogprob token_logprob(const float* logits, int vocab, int token, int k, std::vector<float>& scratch,
                           std::vector<int>& idx) {
  log_softmax(logits, vocab, scratch);
  return logprob_entry(scratch, vocab, token, k, idx);
}

int sample_row(const float* logits, int vocab, const DeviceSampleRow& row, std::vector<int>& idx) {
  return pick(logits, vocab, Filters{row.temperature, row.top_p, row.min_p, row.top_k}, row.u, idx);
}

}  // namespace beluga
