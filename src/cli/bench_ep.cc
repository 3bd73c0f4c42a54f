#include "cli/bench_ep.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_ops.h"
#include "cli/args.h"
#include "loader/weight_source.h"
#include "parallel/expert_parallel.h"
#include "parallel/live_placement.h"
#include "parallel/local_communicator.h"
#include "util/error.h"
#include "util/file.h"

namespace beluga::cli {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs fn(rank, comm) on n threads of one LocalGroup.
template <typename F>
void on_ranks(int n, F fn) {
  LocalGroup g(n);
  std::vector<std::thread> t;
  for (int r = 0; r < n; ++r) t.emplace_back([&, r] { fn(r, g.communicator(r)); });
  for (auto& x : t) x.join();
}

struct A2aResult {
  double a2a_s, memcpy1_s, memcpyn_s;
};

// Seconds per all_to_all_v (rank 0's view, between barriers) and per memcpy of the same bytes.
A2aResult time_all_to_all(int n, int64_t rows, int64_t hidden, int iters) {
  const size_t per_rank = size_t(rows * hidden);
  std::vector<double> a2a;
  on_ranks(n, [&](int r, Communicator& c) {
    std::vector<float> send(per_rank, float(r)), recv(per_rank);
    std::vector<size_t> counts(static_cast<size_t>(n));
    for (int p = 0; p < n; ++p)
      counts[size_t(p)] = size_t(rows * (p + 1) / n - rows * p / n) * size_t(hidden);
    // Rank p sends counts[q] to q; every rank sends q the same, so q receives counts[q] from each.
    std::vector<size_t> recv_counts(size_t(n), counts[size_t(r)]);
    recv.resize(recv_counts[0] * size_t(n));
    for (int it = -2; it < iters; ++it) {
      c.barrier();
      const double t0 = now_s();
      c.all_to_all_v(send.data(), counts, recv.data(), recv_counts);
      const double t1 = now_s();
      if (r == 0 && it >= 0) a2a.push_back(t1 - t0);
    }
  });
  // The same bytes by memcpy: all ranks' rows by one thread, then one thread per rank at once.
  std::vector<float> src(per_rank * size_t(n), 1.0f), dst(per_rank * size_t(n));
  std::vector<double> m1, mn;
  for (int it = -2; it < iters; ++it) {
    const double t0 = now_s();
    std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
    if (it >= 0) m1.push_back(now_s() - t0);
  }
  on_ranks(n, [&](int r, Communicator& c) {
    for (int it = -2; it < iters; ++it) {
      c.barrier();
      const double t0 = now_s();
      std::memcpy(dst.data() + size_t(r) * per_rank, src.data() + size_t(r) * per_rank,
                  per_rank * sizeof(float));
      c.barrier();
      if (r == 0 && it >= 0) mn.push_back(now_s() - t0);
    }
  });
  return {median(a2a), median(m1), median(mn)};
}

struct MoeShape {
  int64_t tokens, hidden, inter;
  int experts, top_k;
};

std::vector<float> random_floats(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace

int bench_ep(int argc, char** argv) {
  Args args = Args::for_command(argc, argv, "bench ep");
  const std::vector<int> ranks = parse_int_list(args.get_or("ranks", "2,4"));
  const std::vector<int> rows_list = parse_int_list(args.get_or("rows", "64,1024,8192"));
  const int64_t hidden = args.get_int("hidden", 2048);
  const int iters = int(args.get_int("iters", 20));
  MoeShape s{args.get_int("moe-tokens", 256), hidden, args.get_int("moe-inter", 256),
             int(args.get_int("experts", 16)), int(args.get_int("top-k", 4))};
  const std::vector<int> eplb_redundant = parse_int_list(args.get_or("eplb-redundant", "0,2"));
  const double skew = std::stod(args.get_or("eplb-skew", "10"));
  const int eplb_steps = int(args.get_int("eplb-steps", 16));
  const auto out_path = args.get("out");
  args.check_all_used();
  BELUGA_CHECK(eplb_steps >= 0, "--eplb-steps must be >= 0");
  BELUGA_CHECK(iters >= 1 && hidden >= 1, "--iters and --hidden must be at least 1");
  for (int n : ranks) BELUGA_CHECK(n >= 1 && n <= s.experts, "--ranks: 1 to --experts ranks");
  BELUGA_CHECK(s.top_k >= 1 && s.top_k <= s.experts && s.tokens >= 0 && s.inter >= 1, "bad MoE shape");

  nlohmann::ordered_json a2a_json = nlohmann::ordered_json::array(),
                         moe_json = nlohmann::ordered_json::array();
  std::printf("all_to_all_v (hidden %lld floats per row)\n", (long long)hidden);
  std::printf("%-6s %-8s %12s %12s %14s %14s %14s\n", "ranks", "rows", "MiB/step", "a2a_us", "a2a_GB/s",
              "memcpy1_GB/s", "memcpyN_GB/s");
  for (int n : ranks)
    for (int rows : rows_list) {
      const A2aResult r = time_all_to_all(n, rows, hidden, iters);
      const double bytes = double(rows) * double(hidden) * 4.0 * n;  // every rank's rows
      std::printf("%-6d %-8d %12.2f %12.1f %14.2f %14.2f %14.2f\n", n, rows, bytes / (1 << 20), r.a2a_s * 1e6,
                  bytes / r.a2a_s / 1e9, bytes / r.memcpy1_s / 1e9, bytes / r.memcpyn_s / 1e9);
      a2a_json.push_back({{"ranks", n},
                          {"rows_per_rank", rows},
                          {"bytes", bytes},
                          {"all_to_all_v_s", r.a2a_s},
                          {"all_to_all_v_gbps", bytes / r.a2a_s / 1e9},
                          {"memcpy_1_thread_gbps", bytes / r.memcpy1_s / 1e9},
                          {"memcpy_n_threads_gbps", bytes / r.memcpyn_s / 1e9}});
    }

  // The MoE layer: random F32 weights.
  std::mt19937 rng(3);
  const int64_t D = s.hidden, I = s.inter;
  std::vector<std::vector<float>> bufs;
  auto tensor = [&](std::initializer_list<int64_t> shape, float scale) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    bufs.push_back(random_floats(size_t(n), scale, rng));
    return Tensor::make(bufs.back().data(), DType::kF32, shape);
  };
  Weight router;
  router.w = tensor({s.experts, D}, 1.0f);
  const Tensor norm = tensor({D}, 1.0f), bias;
  RouterParams params;
  params.top_k = s.top_k;
  std::vector<ExpertWeights> experts(size_t(s.experts));
  const float sd = 1.0f / std::sqrt(float(D)), si = 1.0f / std::sqrt(float(I));
  for (auto& e : experts) {
    e.gate.w = tensor({I, D}, sd);
    e.up.w = tensor({I, D}, sd);
    e.down.w = tensor({D, I}, si);
  }
  const std::vector<float> x = random_floats(size_t(s.tokens * D), 2.0f, rng);
  std::printf("\nMoE layer: %lld tokens, hidden %lld, %d experts of %lld, top-%d (F32)\n",
              (long long)s.tokens, (long long)D, s.experts, (long long)I, s.top_k);
  std::printf("%-6s %14s %14s %12s %14s\n", "ranks", "ops_moe_ms", "ep_moe_ms", "ep/ops", "sent_MiB/step");
  for (int n : ranks) {
    // One rank's Ops::moe on n OpenMP threads, all tokens.
    std::vector<double> ref_t;
    {
      CpuOps ops(CpuOptions{n});
      std::vector<float> res(x), normed(x.size()), out(x.size());
      const MoeLayerRef m{router, bias, params, experts, nullptr};
      for (int it = -1; it < iters; ++it) {
        NormedInput in{Tensor::make(res.data(), DType::kF32, {s.tokens, D}),    {},    norm,
                       Tensor::make(normed.data(), DType::kF32, {s.tokens, D}), 1e-6f, {}};
        const double t0 = now_s();
        ops.moe(Tensor::make(out.data(), DType::kF32, {s.tokens, D}), in, m);
        ops.reset_scratch();
        if (it >= 0) ref_t.push_back(now_s() - t0);
      }
    }
    const ExpertSharding sharding = ExpertSharding::contiguous(s.experts, n);
    std::vector<double> ep_t;
    uint64_t sent = 0;
    on_ranks(n, [&](int r, Communicator& c) {
      CpuOps ops(CpuOptions{1});
      std::vector<ExpertWeights> mine;
      for (int e : sharding.local_experts(r)) mine.push_back(experts[size_t(e)]);
      const int64_t t0r = s.tokens * r / n, rows = s.tokens * (r + 1) / n - t0r;
      std::vector<float> res(x.begin() + t0r * D, x.begin() + (t0r + rows) * D), normed(res.size()),
          out(res.size());
      ExpertParallelMoe ep(ops, c, sharding);
      for (int it = -1; it < iters; ++it) {
        NormedInput in{Tensor::make(res.data(), DType::kF32, {rows, D}),    {},    norm,
                       Tensor::make(normed.data(), DType::kF32, {rows, D}), 1e-6f, {}};
        c.barrier();
        const double t0 = now_s();
        ep.forward(Tensor::make(out.data(), DType::kF32, {rows, D}), in,
                   {router, bias, params, mine, nullptr});
        c.barrier();  // the step ends when the slowest rank is done
        ops.reset_scratch();
        if (r == 0 && it >= 0) ep_t.push_back(now_s() - t0);
      }
      std::vector<float> mine_sent = {float(ep.traffic().sent_bytes) / float(iters + 1)},
                         all(static_cast<size_t>(n));
      c.all_gather(mine_sent.data(), all.data(), sizeof(float));
      if (r == 0)
        for (float b : all) sent += uint64_t(b);
    });
    const double a = median(ref_t), b = median(ep_t);
    std::printf("%-6d %14.2f %14.2f %12.2f %14.2f\n", n, a * 1e3, b * 1e3, b / a, double(sent) / (1 << 20));
    moe_json.push_back({{"ranks", n}, {"ops_moe_s", a}, {"ep_moe_s", b}, {"sent_bytes_per_step", sent}});
  }
  // 3. Live EPLB on a skewed router: the same layer served with replicated tokens (as `serve
  // --expert-parallel-size N --eplb` does), eplb_steps steps on the initial placement, a rebalance
  // planned from their window at the step boundary, then eplb_steps fresh steps.
  nlohmann::ordered_json eplb_json = nlohmann::ordered_json::array();
  if (eplb_steps > 0) {
    // Expert e's router logit gets -skew * ln(E - e): Zipf-like popularity, the hot experts the high
    // ids, all on the last rank in the contiguous layout (and not among the low ids that EPLB's
    // uniform start replicates when there are redundant slots).
    std::vector<float> skew_bias(size_t(s.experts));
    for (int e = 0; e < s.experts; ++e) skew_bias[size_t(e)] = float(-skew * std::log(double(s.experts - e)));
    Weight skewed = router;
    skewed.bias = Tensor::make(skew_bias.data(), DType::kF32, {s.experts});
    std::printf(
        "\nLive EPLB: router bias -%.2f ln(E-e), %d steps of %lld tokens before and after a rebalance "
        "(rows each rank's experts computed; max/mean over ranks; est: EPLB's on the window)\n",
        skew, eplb_steps, (long long)s.tokens);
    std::printf("%-6s %-4s %-6s %12s %12s %10s %10s %7s %11s %10s %12s %12s\n", "ranks", "R", "slots",
                "before", "after", "est_before", "est_after", "moved", "prepare_ms", "switch_us",
                "step_ms_bef", "step_ms_aft");
    DummyWeights unused;  // the loader below copies from the bench's own experts
    for (int n : ranks) {
      if (s.experts % n != 0) continue;
      for (int R : eplb_redundant) {
        LiveEplbOptions o;
        o.redundant_per_rank = R;
        o.interval_steps = eplb_steps;  // after each phase: the first is the one measured
        o.window_steps = eplb_steps;
        o.background =
            false;  // the pause if prepared on the step path: prepare_ms; in the background: switch_us
        LiveExpertPlacement live({0}, s.experts, n, o);
        live.set_source(&unused);
        const LiveExpertPlacement::Loader loader = [&](WeightSource&, int, int e) {
          return experts[size_t(e)];
        };
        for (int r = 0; r < n; ++r) {
          std::vector<ExpertWeights> mine;
          for (int e : live.initial_sharding().local_experts(r)) mine.push_back(experts[size_t(e)]);
          live.attach(r, loader, {mine});
        }
        std::vector<double> rows[2] = {std::vector<double>(size_t(n)), std::vector<double>(size_t(n))};
        std::vector<double> step_t[2];
        RebalanceReport rep;
        std::mt19937 xrng(17);
        std::vector<std::vector<float>> xs;
        for (int i = 0; i < 2 * eplb_steps; ++i)
          xs.push_back(random_floats(size_t(s.tokens * D), 2.0f, xrng));
        on_ranks(n, [&](int r, Communicator& c) {
          CpuOps ops(CpuOptions{1});
          ExpertParallelMoe ep(ops, c, live.initial_sharding());
          std::vector<float> res(size_t(s.tokens * D)), normed(res.size()), out(res.size());
          for (int i = 0; i < 2 * eplb_steps; ++i) {
            const int ph = i < eplb_steps ? 0 : 1;
            c.barrier();
            if (r == 0) live.before_step();
            c.barrier();
            std::copy(xs[size_t(i)].begin(), xs[size_t(i)].end(), res.begin());
            ExpertParallelLayer m{skewed, bias, params, live.experts(r, 0), nullptr};
            m.sharding = &live.sharding(0);
            m.load = &live.window(r);
            NormedInput in{Tensor::make(res.data(), DType::kF32, {s.tokens, D}),    {},    norm,
                           Tensor::make(normed.data(), DType::kF32, {s.tokens, D}), 1e-6f, {}};
            const uint64_t got = ep.traffic().received_rows;
            const double t0 = now_s();
            ep.forward_replicated(Tensor::make(out.data(), DType::kF32, {s.tokens, D}), in, m);
            c.barrier();  // the step ends when the slowest rank is done
            if (r == 0) step_t[ph].push_back(now_s() - t0);
            ops.reset_scratch();
            rows[ph][size_t(r)] += double(ep.traffic().received_rows - got);
            c.barrier();
            if (r == 0) live.after_step();
            if (r == 0 && i == eplb_steps - 1) rep = live.last_report();  // the rebalance between the phases
          }
        });
        const double b = parallel::max_over_mean(rows[0]), a = parallel::max_over_mean(rows[1]);
        const int slots = s.experts / n + R;
        std::printf("%-6d %-4d %-6d %12.3f %12.3f %10.3f %10.3f %7lld %11.3f %10.1f %12.3f %12.3f\n", n, R,
                    slots, b, a, rep.before_max_over_mean, rep.after_max_over_mean,
                    (long long)rep.moved_slots, rep.prepare_ms, rep.switch_us, median(step_t[0]) * 1e3,
                    median(step_t[1]) * 1e3);
        eplb_json.push_back({{"ranks", n},
                             {"redundant_per_rank", R},
                             {"slots_per_rank", slots},
                             {"rebalances", live.rebalances()},
                             {"rank_rows_before", rows[0]},
                             {"rank_rows_after", rows[1]},
                             {"max_over_mean_before", b},
                             {"max_over_mean_after", a},
                             {"eplb_estimate_before", rep.before_max_over_mean},
                             {"eplb_estimate_after", rep.after_max_over_mean},
                             {"moved_slots", rep.moved_slots},
                             {"prepare_ms", rep.prepare_ms},
                             {"switch_us", rep.switch_us},
                             {"step_s_before", median(step_t[0])},
                             {"step_s_after", median(step_t[1])}});
      }
    }
  }
  if (out_path)
    write_file(
        *out_path,
        nlohmann::ordered_json{{"iters", iters},
                               {"hidden", hidden},
                               {"all_to_all_v", a2a_json},
                               {"moe",
                                {{"tokens", s.tokens},
                                 {"experts", s.experts},
                                 {"top_k", s.top_k},
                                 {"moe_inter", s.inter},
                                 {"results", moe_json}}},
                               {"live_eplb", {{"skew", skew}, {"steps", eplb_steps}, {"results", eplb_json}}}}
                .dump(2) +
            "\n");
  return 0;
}

}  // namespace beluga::cli
