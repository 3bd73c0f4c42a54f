#include "engine/mask_filler.h"

#include <algorithm>
#include <chrono>
#include <exception>

namespace beluga {

namespace {
// Waking the workers costs tens of microseconds (a condition variable each): below this many jobs, or
// when the last fill's jobs suggest the whole fill takes less than kMinParallelUs on one thread, the
// caller fills them alone. A mask takes ~0.3-100 us (bench grammar).
constexpr size_t kMinParallelJobs = 4;
constexpr double kMinParallelUs = 150;
}  // namespace

int MaskFiller::default_workers(unsigned cores) {
  return cores >= 8 ? int(std::min(7u, cores / 2 - 1)) : 0;
}

MaskFiller::MaskFiller(int workers) {
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
}

MaskFiller::~MaskFiller() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

size_t MaskFiller::work() {
  size_t done = 0;
  for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < jobs_.size(); ++done) {
    Job& j = jobs_[i];
    try {
      j.proc->fill_mask(j.mask, vocab_);
    } catch (const std::exception& e) {
      j.error = e.what();
      if (j.error.empty()) j.error = "structured output: the mask failed";
    } catch (...) {
      j.error = "structured output: the mask failed";
    }
  }
  return done;
}

void MaskFiller::fill(std::span<Job> jobs, int vocab) {
  for (Job& j : jobs) j.error.clear();
  jobs_ = jobs;
  vocab_ = vocab;
  next_.store(0, std::memory_order_relaxed);
  // The caller's own jobs, timed: its cost per job, smoothed over fills, decides the next fill. Only
  // its work is timed (not waking the workers), so a cheap fill is seen as cheap.
  auto run_mine = [&] {
    const auto t0 = std::chrono::steady_clock::now();
    const size_t mine = work();
    if (mine == 0) return;
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    const double per_job = us / double(mine);
    us_per_job_ = us_per_job_ < 0 ? per_job : 0.5 * (us_per_job_ + per_job);
  };
  const bool cheap = us_per_job_ >= 0 && us_per_job_ * double(jobs.size()) < kMinParallelUs;
  if (threads_.empty() || jobs.size() < kMinParallelJobs || cheap) {
    run_mine();
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++generation_;
    busy_ = int(threads_.size());
  }
  wake_.notify_all();
  run_mine();
  // The jobs (and the span) must outlive every worker's last look at them.
  std::unique_lock<std::mutex> lk(mu_);
  done_.wait(lk, [&] { return busy_ == 0; });
}

void MaskFiller::loop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work();
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (--busy_ == 0) done_.notify_one();
    }
  }
}

}  // namespace beluga
