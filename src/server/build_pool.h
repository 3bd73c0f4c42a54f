// The threads that turn request bodies into engine requests (JSON parsing, chat templating,
// tokenizing: up to max_body_bytes of work each), kept off the I/O threads so that a few large
// requests cannot stall every connection, /health included. Bounded: when `max_queued` tasks wait,
// try_submit refuses and the server answers 503 instead of queueing without limit.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace beluga::server {

class BuildPool {
 public:
  BuildPool(int threads, size_t max_queued);
  ~BuildPool();  // stop()
  BuildPool(const BuildPool&) = delete;
  BuildPool& operator=(const BuildPool&) = delete;

  // Queues `task` (which must not throw: a task owns its error handling). False when the queue is
  // full or the pool is stopped; the task is then not run.
  bool try_submit(std::function<void()> task);
  // Lets the running tasks finish, drops the queued ones unrun and joins the threads. Idempotent.
  void stop();

  size_t queued() const;

 private:
  void work();

  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace beluga::server
