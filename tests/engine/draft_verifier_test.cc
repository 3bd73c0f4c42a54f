// Draft verification (speculative sampling with one-hot drafts): over 200k seeded draws on fixed
// target rows, the first emitted token follows p_1, the token after an accepted draft follows p_2,
// a rejection's correction follows p_1 with the draft removed, and the bonus token follows p_3
// (chi-square); rows are those the sampler draws from (temperature, top_k, top_p, min_p); and the
// tokens are those sample() gives position by position with the same seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/draft_verifier.h"

namespace beluga {
namespace {

constexpr int kDraws = 200000;
constexpr int kVocab = 6;

// What the sampler draws from (sampler.h's order): softmax(logits / T), the top_k most likely, the
// tokens at least min_p times the most likely, the smallest prefix reaching top_p, renormalized.
std::vector<double> target(const std::vector<float>& logits, const SamplingParams& p) {
  const int n = int(logits.size());
  std::vector<double> prob(size_t(n), 0.0);
  std::vector<int> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const int k = p.top_k > 0 ? std::min(p.top_k, n) : n;
  double sum = 0;
  for (int i = 0; i < k; ++i)
    sum += (prob[size_t(order[i])] = std::exp(double(logits[order[i]]) / p.temperature));
  const double floor = p.min_p * prob[size_t(order[0])];
  double acc = 0, kept = 0;
  for (int i = 0; i < k; ++i) {
    const int t = order[size_t(i)];
    if (prob[size_t(t)] < floor || acc >= p.top_p) {
      prob[size_t(t)] = 0;
      continue;
    }
    acc += prob[size_t(t)] / sum;
    kept += prob[size_t(t)];
  }
  for (double& x : prob) x /= kept;
  return prob;
}

// Pearson's statistic of `counts` against `p` (a cell p gives 0 must be empty: +inf otherwise) and
// its degrees of freedom.
std::pair<double, int> chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p) {
  const double n = double(std::accumulate(counts.begin(), counts.end(), int64_t(0)));
  double x2 = 0;
  int cells = 0;
  for (size_t t = 0; t < p.size(); ++t) {
    if (p[t] == 0) {
      if (counts[t] != 0) x2 = INFINITY;
      continue;
    }
    const double e = n * p[t];
    x2 += (double(counts[t]) - e) * (double(counts[t]) - e) / e;
    ++cells;
  }
  return {x2, cells - 1};
}

// The chi-square distribution's upper 1e-4 quantiles by degrees of freedom (1..5): a correct
// verifier fails such a bound once in 10^4 seeds-sets; the draws here are seeded, so it passes or
// fails the same way every run.
double critical(int df) {
  static const double q[] = {0, 15.14, 18.42, 21.11, 23.51, 25.74};
  return q[df];
}

struct Case {
  const char* name;
  SamplingParams params;
  std::vector<std::vector<float>> rows;  // k + 1 rows
  std::vector<int> drafts;               // k
};

void check(const Case& c) {
  SCOPED_TRACE(c.name);
  const int k = int(c.drafts.size());
  std::vector<std::vector<double>> p;
  for (const auto& r : c.rows) p.push_back(target(r, c.params));
  std::vector<float> flat, logits;
  for (const auto& r : c.rows) flat.insert(flat.end(), r.begin(), r.end());
  std::vector<int> stops, prompt, tokens(size_t(k + 1));
  std::unordered_map<int, int> counts;
  std::vector<float> scratch;
  std::vector<int> idx;
  // first[t]: first emitted token; after[j][t]: token j given drafts 0..j-1 accepted; corrected[j][t]:
  // token j given draft j rejected.
  std::vector<int64_t> first(kVocab, 0);
  std::vector<std::vector<int64_t>> after(size_t(k + 1), std::vector<int64_t>(kVocab, 0)), corrected = after;
  std::vector<int64_t> accepted_at(size_t(k), 0);
  for (int d = 0; d < kDraws; ++d) {
    const SampleContext ctx{&c.params, &prompt, &counts, 5, &stops, uint64_t(d) * 0x9e3779b97f4a7c15ull, 3};
    logits = flat;
    const int a = verify_drafts(logits.data(), kVocab, ctx, c.drafts.data(), k, tokens.data(), scratch, idx);
    ASSERT_GE(a, 0);
    ASSERT_LE(a, k);
    first[size_t(tokens[0])]++;
    for (int j = 0; j <= a; ++j) after[size_t(j)][size_t(tokens[size_t(j)])]++;
    for (int j = 0; j < a; ++j) {
      ASSERT_EQ(tokens[size_t(j)], c.drafts[size_t(j)]);
      accepted_at[size_t(j)]++;
    }
    if (a < k) corrected[size_t(a)][size_t(tokens[size_t(a)])]++;
    if (d < 2000) {  // the tokens sample() gives at each position with this seed
      for (int j = 0; j <= a; ++j) {
        SampleContext at = ctx;
        at.num_output += j;
        logits = flat;
        EXPECT_EQ(tokens[size_t(j)],
                  sample(logits.data() + size_t(j) * kVocab, kVocab, at, scratch, idx).token);
      }
    }
  }
  auto expect_follows = [&](const std::vector<int64_t>& counts_, const std::vector<double>& dist,
                            const std::string& what) {
    const auto [x2, df] = chi_square(counts_, dist);
    ASSERT_GE(df, 1) << what;
    EXPECT_LT(x2, critical(df)) << what << ": chi-square " << x2 << " with " << df << " degrees of freedom";
  };
  expect_follows(first, p[0], "first token against p_1");
  for (int j = 0; j < k; ++j) {
    const double pj = p[size_t(j)][size_t(c.drafts[size_t(j)])];
    const double n = double(j == 0 ? kDraws : accepted_at[size_t(j - 1)]);
    // Acceptance at j given j accepted before: p_j(x_j), within 5 standard deviations.
    EXPECT_NEAR(double(accepted_at[size_t(j)]) / n, pj, 5 * std::sqrt(pj * (1 - pj) / n) + 1e-12)
        << "row " << j;
    if (j > 0)
      expect_follows(after[size_t(j)], p[size_t(j)], "token " + std::to_string(j) + " after accepted drafts");
    // The correction: norm(max(p_j - q_j, 0)), p_j without the draft.
    if (pj < 1) {
      std::vector<double> residual = p[size_t(j)];
      residual[size_t(c.drafts[size_t(j)])] = 0;
      const double mass = 1 - pj;
      for (double& x : residual) x /= mass;
      expect_follows(corrected[size_t(j)], residual, "correction at row " + std::to_string(j));
    }
  }
  if (accepted_at[size_t(k - 1)] > 1000)
    expect_follows(after[size_t(k)], p[size_t(k)], "bonus token after every draft accepted");
}

TEST(SpecDraftVerifier, RejectionSamplingKeepsTheTargetDistribution) {
  auto log = [](std::vector<double> p) {
    std::vector<float> l;
    for (double x : p) l.push_back(float(std::log(x)));
    return l;
  };
  const std::vector<float> r1 = log({0.05, 0.4, 0.1, 0.25, 0.15, 0.05}),
                           r2 = log({0.3, 0.05, 0.2, 0.1, 0.25, 0.1}),
                           r3 = log({0.1, 0.1, 0.35, 0.15, 0.1, 0.2});
  Case plain{"temperature 1", {}, {r1, r2, r3}, {1, 4}};
  check(plain);
  Case unlikely{"unlikely drafts", {}, {r1, r2, r3}, {0, 1}};
  check(unlikely);
  Case hot{"temperature 0.7", {}, {r1, r2, r3}, {3, 0}};
  hot.params.temperature = 0.7f;
  check(hot);
  // top_k 4 drops tokens 0 and 5 at the first row: the draft 5 there is never accepted.
  Case topk{"top_k 4 and a draft outside it", {}, {r1, r2}, {5}};
  topk.params.top_k = 4;
  check(topk);
  Case nucleus{"top_p 0.8, min_p 0.3", {}, {r1, r2, r3}, {1, 0}};
  nucleus.params.top_p = 0.8f;
  nucleus.params.min_p = 0.3f;
  nucleus.params.temperature = 1.3f;
  check(nucleus);
}

// Greedy rows: accepted while equal to the argmax, the argmax after.
TEST(SpecDraftVerifier, GreedyAcceptsTheArgmaxPrefix) {
  SamplingParams g;
  g.temperature = 0;
  std::vector<int> none, tokens(4);
  std::unordered_map<int, int> counts;
  std::vector<float> scratch;
  std::vector<int> idx;
  const SampleContext ctx{&g, &none, &counts, 0, &none, 1, 0};
  std::vector<float> rows = {0, 2, 1, 5, 0, 0, 1, 3, 4, 0, 0, 9};  // argmaxes 1, 0, 2, 2 (vocab 3)
  const int drafts[3] = {1, 0, 1};
  EXPECT_EQ(verify_drafts(rows.data(), 3, ctx, drafts, 3, tokens.data(), scratch, idx), 2);
  EXPECT_EQ(tokens[0], 1);
  EXPECT_EQ(tokens[1], 0);
  EXPECT_EQ(tokens[2], 2);
}

}  // namespace
}  // namespace beluga
