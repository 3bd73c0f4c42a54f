#include "parallel/live_placement.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "util/error.h"
#include "util/log.h"

namespace beluga {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// The placement before any statistics: each expert once, contiguously (today's layout); with
// redundant slots, EPLB's plan for a uniform load (every layer the same: extra replicas of the
// lowest-numbered experts, spread over the ranks).
parallel::ExpertPlacement initial_placement(int layers, int experts, int ranks, int redundant) {
  if (redundant == 0) return parallel::ExpertPlacement::contiguous(layers, experts, ranks, 1);
  const std::vector<std::vector<double>> uniform(size_t(layers), std::vector<double>(size_t(experts), 1.0));
  const parallel::EplbShape shape{experts + redundant * ranks, 1, 1, ranks};
  return parallel::ExpertPlacement(parallel::rebalance_experts(uniform, shape), ranks, 1);
}

std::vector<int> layer_map(const parallel::ExpertPlacement& p, int moe) {
  std::vector<int> m(static_cast<size_t>(p.slots()));
  for (int s = 0; s < p.slots(); ++s) m[size_t(s)] = p.logical_of_slot(moe, s);
  return m;
}

// Mean over the layers with any load of max / mean rank load.
double mean_imbalance(const parallel::ExpertPlacement& p, const std::vector<std::vector<double>>& loads) {
  double sum = 0;
  int n = 0;
  for (int m = 0; m < p.layers(); ++m) {
    const std::vector<double> r = rank_loads(p, m, loads[size_t(m)]);
    if (*std::max_element(r.begin(), r.end()) <= 0) continue;
    sum += parallel::max_over_mean(r);
    ++n;
  }
  return n > 0 ? sum / n : 1.0;
}

}  // namespace

std::vector<double> rank_loads(const parallel::ExpertPlacement& p, int moe, std::span<const double> load) {
  std::vector<double> r(static_cast<size_t>(p.num_gpus()), 0.0);
  for (int s = 0; s < p.slots(); ++s) {
    const int e = p.logical_of_slot(moe, s);
    r[size_t(p.rank_of_slot(s))] += load[size_t(e)] / double(p.replicas(moe, e).size());
  }
  return r;
}

LiveExpertPlacement::LiveExpertPlacement(std::vector<int> moe_layers, int experts, int ranks,
                                         LiveEplbOptions options)
    : moe_layers_(std::move(moe_layers)), experts_(experts), ranks_(ranks), opt_(options) {
  BELUGA_CHECK(!moe_layers_.empty(), "live EPLB: a model without MoE layers");
  BELUGA_CHECK(ranks >= 1 && experts >= ranks && experts % ranks == 0, "live EPLB: ", experts,
               " experts do not divide over ", ranks, " ranks");
  BELUGA_CHECK(opt_.redundant_per_rank >= 0 && opt_.interval_steps >= 0 && opt_.window_steps >= 1,
               "live EPLB: redundant experts and the interval must be >= 0, the window >= 1");
  const int L = int(moe_layers_.size());
  state_ = make_state(initial_placement(L, experts, ranks, opt_.redundant_per_rank));
  state_->experts.assign(size_t(ranks), std::vector<std::vector<ExpertWeights>>(size_t(L)));
  initial_ = std::make_unique<ExpertSharding>(sharding(0));
  for (int m = 1; m < L; ++m)
    BELUGA_ASSERT(layer_map(state_->placement, m) == layer_map(state_->placement, 0));
  for (int r = 0; r < ranks; ++r)
    windows_.push_back(std::make_unique<parallel::ExpertLoadWindow>(L, experts, opt_.window_steps));
  loaders_.resize(size_t(ranks));
}

LiveExpertPlacement::~LiveExpertPlacement() {
  join();
}

void LiveExpertPlacement::join() {
  if (worker_.joinable()) worker_.join();
}

int LiveExpertPlacement::moe_index(int layer) const {
  const auto it = std::lower_bound(moe_layers_.begin(), moe_layers_.end(), layer);
  return it != moe_layers_.end() && *it == layer ? int(it - moe_layers_.begin()) : -1;
}

std::unique_ptr<LiveExpertPlacement::State> LiveExpertPlacement::make_state(
    parallel::ExpertPlacement placement) const {
  auto s = std::make_unique<State>(State{std::move(placement), {}, {}});
  for (int m = 0; m < s->placement.layers(); ++m)
    s->shardings.push_back(std::make_unique<ExpertSharding>(experts_, ranks_, layer_map(s->placement, m),
                                                            ExpertSharding::ReplicaChoice::kEven));
  return s;
}

void LiveExpertPlacement::attach(int rank, Loader loader,
                                 std::vector<std::vector<ExpertWeights>> experts_by_moe) {
  BELUGA_CHECK(rank >= 0 && rank < ranks_, "live EPLB: rank ", rank, " of ", ranks_);
  BELUGA_CHECK(experts_by_moe.size() == moe_layers_.size(), "live EPLB: rank ", rank, " loaded ",
               experts_by_moe.size(), " MoE layers of ", moe_layers_.size());
  for (const auto& l : experts_by_moe)
    BELUGA_CHECK(int(l.size()) == state_->placement.slots_per_gpu(), "live EPLB: rank ", rank, " loaded ",
                 l.size(), " experts for ", state_->placement.slots_per_gpu(), " slots");
  loaders_[size_t(rank)] = std::move(loader);
  state_->experts[size_t(rank)] = std::move(experts_by_moe);
}

std::vector<std::vector<double>> LiveExpertPlacement::window_loads() const {
  std::vector<std::vector<double>> sum(moe_layers_.size(), std::vector<double>(size_t(experts_), 0.0));
  for (const auto& w : windows_)
    for (int m = 0; m < int(moe_layers_.size()); ++m) {
      const auto row = w->layer_load(m);
      for (int e = 0; e < experts_; ++e) sum[size_t(m)][size_t(e)] += double(row[size_t(e)]);
    }
  return sum;
}

LiveExpertPlacement::Prepared LiveExpertPlacement::prepare(const std::vector<std::vector<double>>& loads,
                                                           int64_t step) const {
  const auto t0 = Clock::now();
  const State& cur = *state_;
  const parallel::ExpertPlacement& was = cur.placement;
  // One node: the thread ranks share a host, so the global policy's freedom costs nothing.
  const parallel::EplbShape shape{was.slots(), 1, 1, ranks_};
  // Aligned to the current placement: a rank keeps the experts it already holds in their slots, so
  // only slots whose expert really changes load weights.
  parallel::ExpertPlacement next =
      parallel::ExpertPlacement(parallel::rebalance_experts(loads, shape), ranks_, 1).aligned_to(was, false);
  Prepared p;
  p.report.step = step;
  p.report.moved_slots = was.moved_slots(next);
  for (const auto& l : loads)
    for (double x : l) p.report.window_tokens += int64_t(x);
  p.report.before_max_over_mean = mean_imbalance(was, loads);
  p.report.after_max_over_mean = mean_imbalance(next, loads);
  p.state = make_state(std::move(next));
  const parallel::ExpertPlacement& now = p.state->placement;
  const int per = now.slots_per_gpu();
  p.state->experts.resize(size_t(ranks_));
  for (int r = 0; r < ranks_; ++r) {
    auto& mine = p.state->experts[size_t(r)];
    mine.resize(moe_layers_.size());
    for (int m = 0; m < int(moe_layers_.size()); ++m) {
      const auto& old = cur.experts[size_t(r)][size_t(m)];
      for (int k = 0; k < per; ++k) {
        const int e = now.logical_of_slot(m, r * per + k);
        // An expert this rank already holds (in any of its slots) is reused as it is.
        int had = -1;
        for (int j = 0; j < per && had < 0; ++j)
          if (was.logical_of_slot(m, r * per + j) == e) had = j;
        if (had >= 0) {
          mine[size_t(m)].push_back(old[size_t(had)]);
          continue;
        }
        BELUGA_CHECK(source_ && loaders_[size_t(r)], "live EPLB: rank ", r,
                     " has no weight source or loader for a moved expert");
        mine[size_t(m)].push_back(loaders_[size_t(r)](*source_, moe_layers_[size_t(m)], e));
      }
    }
  }
  p.report.prepare_ms = ms_since(t0);
  return p;
}

void LiveExpertPlacement::apply(Prepared p) {
  // A plan that does not lower the window's imbalance moves weights for nothing (or for worse: the
  // demo model's window once planned 1.157 -> 1.171): the current placement stays, with its window.
  if (p.report.after_max_over_mean >= p.report.before_max_over_mean) {
    ++skipped_;
    log::info("eplb", "rebalance at step ", p.report.step, " skipped: the plan's rank load max/mean ",
              p.report.after_max_over_mean, " is not below the current ", p.report.before_max_over_mean);
    return;
  }
  const auto t0 = Clock::now();
  state_ = std::move(p.state);  // the old placement's weights are views (or the backend's): nothing to free
  // The new placement starts its statistics afresh, as DeepSeek's EPLB does.
  for (auto& w : windows_) w->clear();
  p.report.switch_us = ms_since(t0) * 1e3;
  ++rebalances_;
  moved_total_ += p.report.moved_slots;
  last_ = p.report;
  log::info("eplb", "rebalance ", rebalances_, " at step ", last_.step, ": ", last_.moved_slots,
            " slots moved over ", moe_layers_.size(), " MoE layers, rank load max/mean ",
            last_.before_max_over_mean, " -> ", last_.after_max_over_mean, " on ", last_.window_tokens,
            " routed tokens; prepared in ", last_.prepare_ms, " ms", opt_.background ? " (background)" : "",
            ", switched in ", last_.switch_us, " us");
}

void LiveExpertPlacement::before_step() {
  if (!ready_.load(std::memory_order_acquire)) return;
  join();
  ready_.store(false, std::memory_order_relaxed);
  std::unique_ptr<Prepared> p;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(mu_);
    p = std::move(prepared_);
    err = std::exchange(error_, nullptr);
  }
  if (err) {
    // A failed plan or load leaves the current placement serving: it is still correct, only slower.
    try {
      std::rethrow_exception(err);
    } catch (const std::exception& e) {
      log::warn("eplb", "rebalance failed, keeping the current placement: ", e.what());
    }
    return;
  }
  apply(std::move(*p));
}

void LiveExpertPlacement::after_step() {
  for (auto& w : windows_) w->end_step();
  ++steps_;
  if (opt_.interval_steps <= 0 || steps_ % opt_.interval_steps != 0) return;
  // The last one is still preparing, or waits for its switch.
  if (worker_.joinable() || ready_.load(std::memory_order_acquire)) return;
  std::vector<std::vector<double>> loads = window_loads();
  bool any = false;
  for (const auto& l : loads) any = any || std::any_of(l.begin(), l.end(), [](double x) { return x > 0; });
  if (!any) return;
  if (!opt_.background) {
    apply(prepare(loads, steps_));
    return;
  }
  worker_ = std::thread([this, loads = std::move(loads), step = steps_] {
    std::unique_ptr<Prepared> p;
    std::exception_ptr err;
    try {
      p = std::make_unique<Prepared>(prepare(loads, step));
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      prepared_ = std::move(p);
      error_ = err;
    }
    ready_.store(true, std::memory_order_release);
  });
}

RebalanceReport LiveExpertPlacement::rebalance_now() {
  if (worker_.joinable() || ready_.load(std::memory_order_acquire)) {  // one in flight is superseded
    join();
    ready_.store(false, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    prepared_.reset();
    error_ = nullptr;
  }
  Prepared p = prepare(window_loads(), steps_);
  const RebalanceReport planned = p.report;
  const int64_t applied = rebalances_;
  apply(std::move(p));
  return rebalances_ > applied ? last_ : planned;
}

}  // namespace beluga
