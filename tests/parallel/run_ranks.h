// Runs fn(comm) on every rank of a LocalGroup of n ranks, one thread each, and rethrows the first
// rank's error (a failing rank aborts the group, so the others do not wait for it forever); the group
// moves buffers with `transport` (default: host memory).
#pragma once

#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "parallel/local_communicator.h"

namespace beluga::test {

inline void run_ranks(int n, const std::function<void(Communicator&)>& fn, LocalTransport transport = {}) {
  LocalGroup group(n, std::move(transport));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      Communicator& c = group.communicator(r);
      try {
        fn(c);
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
        c.abort();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace beluga::test
