#include "engine/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "engine/sampler.h"
#include "util/error.h"

namespace beluga {

namespace {

std::vector<int> blocks_for(int first_block, int tokens) {
  std::vector<int> b((tokens + kKvBlockSize - 1) / kKvBlockSize);
  for (size_t i = 0; i < b.size(); ++i) b[i] = first_block + int(i);
  return b;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::vector<std::vector<int>> Generator::generate(const std::vector<std::vector<int>>& prompts,
                                                  const GenerateParams& p,
                                                  const std::function<void(const StepTiming&)>& on_step) {
  const int S = int(prompts.size());
  const int V = model_.config().vocab_size;
  BELUGA_CHECK(p.max_tokens >= 0, "max_tokens must be >= 0");
  int blocks_per_seq = 0;
  for (const auto& pr : prompts) {
    BELUGA_CHECK(!pr.empty(), "empty prompt");
    blocks_per_seq =
        std::max(blocks_per_seq, int((pr.size() + p.max_tokens + kKvBlockSize - 1) / kKvBlockSize));
  }
  KvCache kv = model_.make_kv_cache(std::max(1, blocks_per_seq * S));
  std::vector<std::vector<int>> out(S);
  std::vector<float> logits(size_t(S) * V);
  std::vector<int> next(S);
  if (p.max_tokens == 0) return out;
  // The server's sampler, so `generate` and `serve` agree for the same seed.
  SamplingParams sp;
  sp.temperature = p.temperature;
  const std::unordered_map<int, int> no_counts;
  const std::vector<int> no_stops;
  std::vector<float> scratch;
  std::vector<int> index_scratch;
  auto pick = [&](float* row, int s, int step) {
    SampleContext ctx{&sp, &prompts[s], &no_counts, step, &no_stops, p.seed, s};
    return sample(row, V, ctx, scratch, index_scratch).token;
  };

  // Prefill every prompt, chunk by chunk, all sequences in the same steps.
  std::vector<int> done(S, 0);
  const int chunk = p.prefill_chunk > 0 ? p.prefill_chunk : 1 << 30;
  for (bool more = true; more;) {
    more = false;
    Batch b;
    std::vector<int> last_of;  // sequences whose prompt ends in this step
    for (int s = 0; s < S; ++s) {
      const int n = int(prompts[s].size()), start = done[s];
      if (start >= n) continue;
      const int len = std::min(chunk, n - start);
      b.seqs.push_back({start, len, blocks_for(s * blocks_per_seq, start + len)});
      b.tokens.insert(b.tokens.end(), prompts[s].begin() + start, prompts[s].begin() + start + len);
      done[s] += len;
      if (done[s] == n) {
        b.logit_rows.push_back(int(b.tokens.size()) - 1);
        last_of.push_back(s);
      } else {
        more = true;
      }
    }
    if (b.tokens.empty()) break;
    const double t0 = now_s();
    ForwardOptions fo;
    fo.mla_mode = p.mla_mode;
    model_.forward(b, kv, logits.data(), fo);
    if (on_step) on_step({true, int(b.tokens.size()), now_s() - t0});
    for (size_t i = 0; i < last_of.size(); ++i) next[last_of[i]] = pick(logits.data() + i * V, last_of[i], 0);
  }

  std::vector<bool> finished(S, false);
  auto accept = [&](int s) {
    out[s].push_back(next[s]);
    if (int(out[s].size()) >= p.max_tokens ||
        std::find(p.stop_ids.begin(), p.stop_ids.end(), next[s]) != p.stop_ids.end())
      finished[s] = true;
  };
  for (int s = 0; s < S; ++s) accept(s);
  for (int step = 1;; ++step) {
    Batch b;
    std::vector<int> active;
    for (int s = 0; s < S; ++s) {
      if (finished[s]) continue;
      const int ctx = int(prompts[s].size() + out[s].size()) - 1;
      b.seqs.push_back({ctx, 1, blocks_for(s * blocks_per_seq, ctx + 1)});
      b.tokens.push_back(out[s].back());
      b.logit_rows.push_back(int(b.tokens.size()) - 1);
      active.push_back(s);
    }
    if (active.empty()) break;
    const double t0 = now_s();
    ForwardOptions fo;
    fo.mla_mode = p.mla_mode;
    model_.forward(b, kv, logits.data(), fo);
    if (on_step) on_step({false, int(b.tokens.size()), now_s() - t0});
    for (size_t i = 0; i < active.size(); ++i) {
      next[active[i]] = pick(logits.data() + i * V, active[i], step);
      accept(active[i]);
    }
  }
  return out;
}

std::vector<float> Generator::prompt_logits(const std::vector<int>& prompt, MlaMode mode,
                                            std::vector<std::vector<float>>* hidden_capture) {
  BELUGA_CHECK(!prompt.empty(), "empty prompt");
  const int n = int(prompt.size()), V = model_.config().vocab_size;
  KvCache kv = model_.make_kv_cache((n + kKvBlockSize - 1) / kKvBlockSize);
  Batch b;
  b.tokens = prompt;
  b.seqs.push_back({0, n, blocks_for(0, n)});
  for (int i = 0; i < n; ++i) b.logit_rows.push_back(i);
  std::vector<float> logits(size_t(n) * V);
  ForwardOptions opt;
  opt.mla_mode = mode;
  opt.hidden_capture = hidden_capture;
  opt.capture_row = n - 1;
  model_.forward(b, kv, logits.data(), opt);
  return logits;
}

}  // namespace beluga
