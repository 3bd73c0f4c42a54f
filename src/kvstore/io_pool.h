// IoPool: a few threads that run blocking file I/O jobs in submission order per thread, off the
// engine thread. Destruction runs the jobs still queued, then joins.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace beluga::kv {

class IoPool {
 public:
  explicit IoPool(int threads);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  void submit(std::function<void()> job);
  void drain();  // waits until every job submitted so far has run

 private:
  void run();
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::function<void()>> jobs_;
  int busy_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace beluga::kv
