#include "server/build_pool.h"

#include <algorithm>

namespace beluga::server {

BuildPool::BuildPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { work(); });
}

BuildPool::~BuildPool() {
  stop();
}

bool BuildPool::try_submit(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (stop_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

void BuildPool::stop() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  threads_.clear();
  dropped.clear();  // outside the lock: a task's captures may take locks of their own
}

size_t BuildPool::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void BuildPool::work() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopped
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

}  // namespace beluga::server
