#include "cli/bench_sampler.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "engine/sampler.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

// The calling thread's CPU time: a shared machine's preemptions do not count.
double thread_cpu_us() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e6 + double(ts.tv_nsec) / 1e3;
}

struct Setting {
  const char* name;
  SamplingParams p;
};

std::vector<Setting> settings() {
  std::vector<Setting> s;
  SamplingParams p;
  p.temperature = 0;
  s.push_back({"greedy", p});
  p = {};
  s.push_back({"temperature=1", p});
  p = {};
  p.top_p = 0.9f;
  s.push_back({"top_p=0.9", p});
  p = {};
  p.top_k = 50;
  s.push_back({"top_k=50", p});
  p = {};
  p.top_k = 50;
  p.top_p = 0.9f;
  s.push_back({"top_k=50,top_p=0.9", p});
  p = {};
  p.min_p = 0.05f;
  s.push_back({"min_p=0.05", p});
  p = {};
  p.top_p = 0.9f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.2f;
  s.push_back({"top_p=0.9,penalties", p});
  return s;
}

std::vector<float> row(std::mt19937_64& rng, int vocab, bool peaked) {
  // Peaked: 20 candidates far above a unit-normal tail, the first few holding most of the mass (a
  // 0.9 nucleus of a handful of tokens). Flat: all within a few hundredths.
  std::normal_distribution<float> n(0.0f, peaked ? 1.0f : 0.05f);
  std::vector<float> l(static_cast<size_t>(vocab));
  for (auto& x : l) x = n(rng);
  if (peaked)
    for (int i = 0; i < 20; ++i) l[rng() % size_t(vocab)] += 20.0f - 0.7f * float(i);
  return l;
}

double pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p / 100.0 * double(v.size() - 1) + 0.5))];
}

}  // namespace

int bench_sampler(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench sampler");
  const std::vector<int> vocabs = parse_int_list(args.get_or("vocab", "8192,131072"));
  const int iters = int(args.get_int("iters", 200));
  const auto out_path = args.get("out");
  args.check_all_used();
  BELUGA_CHECK(iters >= 1, "--iters must be at least 1");
  for (int v : vocabs) BELUGA_CHECK(v >= 2, "--vocab sizes must be at least 2");

  // A 4096-token prompt and 256 generated tokens so far: what the penalties look at.
  std::mt19937_64 rng(1);
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  std::printf("%-8s %-7s %-22s %10s %10s %10s\n", "vocab", "logits", "params", "mean_us", "p50_us", "p99_us");
  for (int vocab : vocabs) {
    std::vector<int> prompt(4096);
    for (auto& t : prompt) t = int(rng() % uint64_t(vocab));
    const std::vector<int> prompt_set = distinct_tokens(prompt);
    std::unordered_map<int, int> counts;
    for (int i = 0; i < 256; ++i) counts[int(rng() % uint64_t(vocab))]++;
    const std::vector<int> stops = {0};
    for (bool peaked : {true, false}) {
      std::vector<std::vector<float>> rows;
      for (int i = 0; i < 8; ++i) rows.push_back(row(rng, vocab, peaked));
      for (const Setting& s : settings()) {
        std::vector<float> work(static_cast<size_t>(vocab)), scratch;
        std::vector<int> idx;
        std::vector<double> us;
        int64_t checksum = 0;
        for (int it = -8; it < iters; ++it) {  // 8 warm-up calls size the buffers
          const std::vector<float>& r = rows[size_t(it + 8) % rows.size()];
          std::copy(r.begin(), r.end(), work.begin());
          SampleContext ctx{&s.p, &prompt, &counts, 256 + it, &stops, 42, 0};
          ctx.prompt_set = &prompt_set;
          const double t0 = thread_cpu_us();
          checksum += sample(work.data(), vocab, ctx, scratch, idx).token;
          const double t1 = thread_cpu_us();
          if (it >= 0) us.push_back(t1 - t0);
        }
        double mean = 0;
        for (double x : us) mean += x / double(us.size());
        std::printf("%-8d %-7s %-22s %10.2f %10.2f %10.2f\n", vocab, peaked ? "peaked" : "flat", s.name, mean,
                    pct(us, 50), pct(us, 99));
        results.push_back({{"vocab", vocab},
                           {"logits", peaked ? "peaked" : "flat"},
                           {"params", s.name},
                           {"mean_us", mean},
                           {"p50_us", pct(us, 50)},
                           {"p99_us", pct(us, 99)},
                           {"token_checksum", checksum}});
      }
    }
  }
  if (out_path)
    write_file(*out_path, nlohmann::ordered_json{{"iters", iters}, {"results", results}}.dump(2) + "\n");
  return 0;
}

}  // namespace beluga::cli
