#include "cli/bench_eplb.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "parallel/eplb.h"
#include "parallel/expert_load.h"
#include "parallel/expert_placement.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

using parallel::EplbPlan;
using parallel::EplbPolicy;
using parallel::ExpertPlacement;

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

// Routed expert ids, [layer][token * top_k + j].
using Routing = std::vector<std::vector<int32_t>>;

// Each layer's popularity: Zipf(s) over a random order of its experts, as a cumulative distribution.
std::vector<std::vector<double>> popularity(int layers, int experts, double s, std::mt19937_64& rng) {
  std::vector<std::vector<double>> cdf(static_cast<size_t>(layers));
  for (auto& c : cdf) {
    std::vector<int> order(static_cast<size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<double> p(static_cast<size_t>(experts));
    for (int r = 0; r < experts; ++r) p[size_t(order[size_t(r)])] = 1.0 / std::pow(double(r + 1), s);
    c.resize(p.size());
    std::partial_sum(p.begin(), p.end(), c.begin());
  }
  return cdf;
}

// `tokens` tokens per layer, each routed to top_k distinct experts drawn by popularity.
Routing route(const std::vector<std::vector<double>>& cdf, int tokens, int top_k, std::mt19937_64& rng) {
  Routing out(cdf.size());
  for (size_t l = 0; l < cdf.size(); ++l) {
    const auto& c = cdf[l];
    std::uniform_real_distribution<double> u(0.0, c.back());
    auto& ids = out[l];
    ids.reserve(size_t(tokens) * size_t(top_k));
    for (int t = 0; t < tokens; ++t) {
      const size_t first = ids.size();
      while (ids.size() - first < size_t(top_k)) {
        const int e = int(std::upper_bound(c.begin(), c.end(), u(rng)) - c.begin());
        if (std::find(ids.begin() + long(first), ids.end(), e) == ids.end())
          ids.push_back(std::min(e, int(c.size()) - 1));
      }
    }
  }
  return out;
}

// The statistics window after the routing arrives in steps of `step_tokens` tokens.
std::vector<std::vector<double>> window_loads(const Routing& r, int experts, int top_k, int step_tokens) {
  const int tokens = int(r[0].size()) / top_k;
  const int steps = (tokens + step_tokens - 1) / step_tokens;
  parallel::ExpertLoadWindow win(int(r.size()), experts, steps);
  for (int s = 0; s < steps; ++s) {
    const size_t begin = size_t(s) * size_t(step_tokens) * size_t(top_k);
    const size_t end = std::min(r[0].size(), begin + size_t(step_tokens) * size_t(top_k));
    for (size_t l = 0; l < r.size(); ++l)
      win.add_routing(int(l), std::span<const int32_t>(r[l].data() + begin, end - begin));
    win.end_step();
  }
  return win.loads();
}

struct Balance {
  double mean = 0;   // max / mean over GPUs, averaged over layers
  double worst = 0;  // the worst layer's
};

// Held-out tokens through the placement's replica choice: the routed tokens each GPU receives.
Balance measure(const ExpertPlacement& p, const Routing& r, int top_k) {
  Balance b;
  std::vector<double> per_gpu(size_t(p.num_gpus()));
  for (size_t l = 0; l < r.size(); ++l) {
    std::fill(per_gpu.begin(), per_gpu.end(), 0.0);
    for (size_t i = 0; i < r[l].size(); ++i) {
      const uint64_t token = i / size_t(top_k);
      per_gpu[size_t(p.rank_of_slot(p.choose(int(l), r[l][i], token)))] += 1;
    }
    const double x = parallel::max_over_mean(per_gpu);
    b.mean += x / double(r.size());
    b.worst = std::max(b.worst, x);
  }
  return b;
}

// The plan's own view on its window: each replica takes load / count.
double planned(const EplbPlan& plan, const std::vector<std::vector<double>>& loads, int gpus) {
  double sum = 0;
  for (size_t l = 0; l < loads.size(); ++l)
    sum += parallel::max_over_mean(parallel::gpu_loads(plan.layers[l], loads[l], gpus));
  return sum / double(loads.size());
}

// Slots per layer holding a second (third, ...) replica of an expert on the same GPU: wasted slots.
double colocated(const ExpertPlacement& p) {
  int64_t n = 0;
  for (int l = 0; l < p.layers(); ++l)
    for (int r = 0; r < p.num_gpus(); ++r) {
      std::vector<int> e = p.experts_on_rank(l, r);
      std::sort(e.begin(), e.end());
      n += int64_t(e.size()) - (std::unique(e.begin(), e.end()) - e.begin());
    }
  return double(n) / double(p.layers());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int bench_eplb(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench eplb");
  const int experts = int(args.get_int("experts", 256));
  const int groups = int(args.get_int("groups", 8));
  const int top_k = int(args.get_int("top-k", 8));
  const int layers = int(args.get_int("layers", 58));
  const std::vector<int> gpu_list = parse_int_list(args.get_or("gpus", "8,16,32,64"));
  const auto nodes_arg = args.get("nodes");
  const std::vector<int> redundant_list = parse_int_list(args.get_or("redundant-per-gpu", "1,4"));
  const double zipf = args.get_double("zipf", 1.0);
  const int tokens = int(args.get_int("tokens", 8192));
  const int step_tokens = int(args.get_int("step-tokens", 256));
  const uint64_t seed = uint64_t(args.get_int("seed", 0));
  const int repeat = int(args.get_int("repeat", 5));
  const auto out_path = args.get("out");
  args.check_all_used();
  BELUGA_CHECK(experts >= 1 && layers >= 1 && tokens >= 1 && step_tokens >= 1 && repeat >= 1,
               "--experts, --layers, --tokens, --step-tokens and --repeat must be at least 1");
  BELUGA_CHECK(top_k >= 1 && top_k <= experts, "--top-k must be in [1, --experts]");
  BELUGA_CHECK(zipf >= 0, "--zipf must be non-negative");
  std::vector<int> node_list;
  if (nodes_arg) node_list = parse_int_list(*nodes_arg);
  BELUGA_CHECK(node_list.empty() || node_list.size() == 1 || node_list.size() == gpu_list.size(),
               "--nodes: one count, or one per --gpus entry");

  std::mt19937_64 rng(seed);
  const auto cdf = popularity(layers, experts, zipf, rng);
  const Routing window_a = route(cdf, tokens, top_k, rng);
  const Routing window_b = route(cdf, tokens, top_k, rng);  // the next window: what a rebalance rewrites
  const Routing held_out = route(cdf, tokens, top_k, rng);
  const auto loads_a = window_loads(window_a, experts, top_k, step_tokens);
  const auto loads_b = window_loads(window_b, experts, top_k, step_tokens);

  std::printf(
      "EPLB: %d layers x %d experts (%d groups), top-%d, Zipf s=%.2f, %d tokens per window and held out; "
      "limit max/mean = 1.00; moved, aligned: slots per GPU and layer that the next window's plan rewrites; "
      "coloc: slots per layer holding a second replica of an expert on the same GPU\n",
      layers, experts, groups, top_k, zipf, tokens);
  std::printf("%5s %5s %4s %5s %-13s %-9s %9s %9s %9s %8s %8s %7s %7s %6s\n", "gpus", "nodes", "red", "slots",
              "placement", "spread", "planned", "held_out", "worst_lyr", "plan_ms", "align_ms", "moved",
              "aligned", "coloc");
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (size_t gi = 0; gi < gpu_list.size(); ++gi) {
    const int gpus = gpu_list[gi];
    const int nodes = node_list.empty() ? std::max(1, gpus / 8) : node_list[node_list.size() == 1 ? 0 : gi];
    BELUGA_CHECK(gpus >= 1 && nodes >= 1 && gpus % nodes == 0, "--nodes ", nodes, " does not divide ", gpus,
                 " GPUs");
    BELUGA_CHECK(experts % gpus == 0, "--experts ", experts, " does not divide over ", gpus, " GPUs");
    const ExpertPlacement before = ExpertPlacement::contiguous(layers, experts, gpus, nodes);
    const Balance b0 = measure(before, held_out, top_k);
    std::vector<double> contiguous(static_cast<size_t>(gpus));
    double planned0 = 0;
    for (const auto& l : loads_a) {
      std::fill(contiguous.begin(), contiguous.end(), 0.0);
      for (int e = 0; e < experts; ++e) contiguous[size_t(e / (experts / gpus))] += l[size_t(e)];
      planned0 += parallel::max_over_mean(contiguous) / double(layers);
    }
    std::printf("%5d %5d %4d %5d %-13s %-9s %9.3f %9.3f %9.3f %8s %8s %7s %7s %6s\n", gpus, nodes, 0, experts,
                "contiguous", "-", planned0, b0.mean, b0.worst, "-", "-", "-", "-", "-");
    rows.push_back({{"gpus", gpus},
                    {"nodes", nodes},
                    {"redundant_per_gpu", 0},
                    {"slots", experts},
                    {"placement", "contiguous"},
                    {"planned_max_over_mean", planned0},
                    {"held_out_max_over_mean", b0.mean},
                    {"held_out_worst_layer", b0.worst}});
    for (int red : redundant_list) {
      const parallel::EplbShape shape{experts + red * gpus, groups, nodes, gpus};
      for (EplbPolicy policy : {EplbPolicy::hierarchical, EplbPolicy::global}) {
        if (policy == EplbPolicy::hierarchical && groups % nodes != 0) continue;
        for (bool spread : {true, false}) {
          const parallel::EplbOptions opt{policy, spread};
          std::vector<double> ms;
          EplbPlan plan;
          for (int i = 0; i < repeat; ++i) {
            const double t0 = thread_cpu_ms();
            plan = parallel::rebalance_experts(loads_a, shape, opt);
            ms.push_back(thread_cpu_ms() - t0);
          }
          const ExpertPlacement after(plan, gpus, nodes);
          const ExpertPlacement next(parallel::rebalance_experts(loads_b, shape, opt), gpus, nodes);
          const Balance b = measure(after, held_out, top_k);
          const double p = planned(plan, loads_a, gpus);
          const double per = double(layers) * double(gpus);
          const double moved = double(after.moved_slots(next)) / per;
          const double a0 = thread_cpu_ms();
          const ExpertPlacement aligned = next.aligned_to(after, policy == EplbPolicy::hierarchical);
          const double align_ms = thread_cpu_ms() - a0;
          const double moved_aligned = double(after.moved_slots(aligned)) / per;
          const char* name = policy == EplbPolicy::hierarchical ? "hierarchical" : "global";
          std::printf("%5d %5d %4d %5d %-13s %-9s %9.3f %9.3f %9.3f %8.2f %8.2f %7.2f %7.2f %6.2f\n", gpus,
                      nodes, red, shape.num_replicas, name, spread ? "spread" : "published", p, b.mean,
                      b.worst, median(ms), align_ms, moved, moved_aligned, colocated(after));
          rows.push_back({{"gpus", gpus},
                          {"nodes", nodes},
                          {"redundant_per_gpu", red},
                          {"slots", shape.num_replicas},
                          {"placement", name},
                          {"spread_replicas", spread},
                          {"planned_max_over_mean", p},
                          {"held_out_max_over_mean", b.mean},
                          {"held_out_worst_layer", b.worst},
                          {"rebalance_cpu_ms_median", median(ms)},
                          {"rebalance_cpu_ms_min", *std::min_element(ms.begin(), ms.end())},
                          {"align_cpu_ms", align_ms},
                          {"colocated_slots_per_layer", colocated(after)},
                          {"moved_slots_per_layer_per_gpu", moved},
                          {"moved_slots_per_layer_per_gpu_aligned", moved_aligned}});
        }
      }
    }
  }
  if (out_path)
    write_file(*out_path, nlohmann::ordered_json{{"experts", experts},
                                                 {"groups", groups},
                                                 {"top_k", top_k},
                                                 {"layers", layers},
                                                 {"zipf", zipf},
                                                 {"tokens", tokens},
                                                 {"step_tokens", step_tokens},
                                                 {"seed", seed},
                                                 {"rows", rows}}
                                  .dump(2) +
                              "\n");
  return 0;
}

}  // namespace beluga::cli
