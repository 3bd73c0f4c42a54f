// LocalCommunicator's collectives against hand-computed results, 1 to 4 ranks.
#include "parallel/local_communicator.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "run_ranks.h"
#include "util/error.h"

namespace beluga {
namespace {

using test::run_ranks;

// Rank s sends (s + 1) * (d + 1) floats to rank d (so counts differ per pair), valued 100 s + 10 d + i.
TEST(LocalCommunicator, AllToAllVUnevenCounts) {
  for (int n = 1; n <= 4; ++n) {
    run_ranks(n, [n](Communicator& c) {
      const int s = c.rank();
      ASSERT_EQ(c.size(), n);
      std::vector<size_t> send_counts, recv_counts;
      std::vector<float> send;
      for (int d = 0; d < n; ++d) {
        send_counts.push_back(size_t((s + 1) * (d + 1)));
        recv_counts.push_back(size_t((d + 1) * (s + 1)));
        for (size_t i = 0; i < send_counts.back(); ++i) send.push_back(float(100 * s + 10 * d + int(i)));
      }
      std::vector<float> recv(std::accumulate(recv_counts.begin(), recv_counts.end(), size_t(0)), -1.0f);
      c.all_to_all_v(send.data(), send_counts, recv.data(), recv_counts);
      size_t k = 0;
      for (int p = 0; p < n; ++p)
        for (size_t i = 0; i < recv_counts[size_t(p)]; ++i, ++k)
          EXPECT_EQ(recv[k], float(100 * p + 10 * s + int(i))) << "n=" << n << " rank " << s << " from " << p;
    });
  }
}

// A group whose buffers the transport moves (as thread ranks on GPUs do: CudaOps::copy_between and
// each rank's stream synchronized first): every byte a rank receives goes through `copy`, each rank is
// made ready before each of its collectives, and the results are the host group's.
TEST(LocalCommunicator, ATransportMovesEveryByteAndEachRankIsReadyFirst) {
  constexpr int n = 3;
  std::atomic<size_t> copied{0};
  std::array<std::atomic<int>, n> ready{};
  LocalTransport t;
  t.copy = [&](void* dst, const void* src, size_t bytes) {
    copied += bytes;
    std::memcpy(dst, src, bytes);
  };
  for (int r = 0; r < n; ++r) t.ready.push_back([&ready, r] { ++ready[size_t(r)]; });
  run_ranks(
      n,
      [](Communicator& c) {
        const int s = c.rank();
        // all_to_all_v: 2 floats to every rank, valued 10 s + d.
        std::vector<float> send, recv(2 * n, -1.0f);
        for (int d = 0; d < n; ++d) send.insert(send.end(), 2, float(10 * s + d));
        const std::vector<size_t> two(n, 2);
        c.all_to_all_v(send.data(), two, recv.data(), two);
        for (int p = 0; p < n; ++p) EXPECT_EQ(recv[size_t(2 * p)], float(10 * p + s));
        // all_gather of one int each; all_reduce_sum of 4 floats (rank r holds r + i).
        const int32_t mine = 7 * s;
        std::vector<int32_t> all(n, -1);
        c.all_gather(&mine, all.data(), sizeof(mine));
        for (int p = 0; p < n; ++p) EXPECT_EQ(all[size_t(p)], 7 * p);
        std::vector<float> x = {float(s), float(s + 1), float(s + 2), float(s + 3)};
        c.all_reduce_sum(x.data(), x.size());
        for (int i = 0; i < 4; ++i) EXPECT_EQ(x[size_t(i)], float(3 + 3 * i));  // 0+1+2 + 3 i
        c.barrier();
      },
      std::move(t));
  // Per rank: 3 x 8 bytes received, 3 x 4 gathered, 3 x 16 read for the sum and 16 written back.
  EXPECT_EQ(copied.load(), size_t(n) * (24 + 12 + 48 + 16));
  for (int r = 0; r < n; ++r) EXPECT_EQ(ready[size_t(r)].load(), 4) << "rank " << r;  // one per collective
}

// Only rank 0 sends, only to the last rank; every other pair has a zero count.
TEST(LocalCommunicator, AllToAllVZeroCounts) {
  for (int n = 1; n <= 4; ++n) {
    run_ranks(n, [n](Communicator& c) {
      const int r = c.rank();
      std::vector<size_t> send_bytes(size_t(n), 0), recv_bytes(size_t(n), 0);
      const std::vector<uint8_t> payload = {7, 8, 9};
      if (r == 0) send_bytes[size_t(n - 1)] = payload.size();
      if (r == n - 1) recv_bytes[0] = payload.size();
      std::vector<uint8_t> recv(3, 0);
      c.all_to_all_v(payload.data(), send_bytes, recv.data(), recv_bytes);
      if (r == n - 1)
        EXPECT_EQ(recv, payload);
      else
        EXPECT_EQ(recv, std::vector<uint8_t>(3, 0));
      // Nothing at all moves: still a collective that returns.
      std::vector<size_t> none(size_t(n), 0);
      c.all_to_all_v(static_cast<const void*>(nullptr), none, static_cast<void*>(nullptr), none);
    });
  }
}

TEST(LocalCommunicator, AllGatherInRankOrder) {
  for (int n = 1; n <= 4; ++n) {
    run_ranks(n, [n](Communicator& c) {
      const int32_t mine[2] = {c.rank(), -c.rank() * 3};
      std::vector<int32_t> all(size_t(2 * n), 99);
      c.all_gather(mine, all.data(), sizeof(mine));
      for (int p = 0; p < n; ++p) {
        EXPECT_EQ(all[size_t(2 * p)], p);
        EXPECT_EQ(all[size_t(2 * p + 1)], -3 * p);
      }
    });
  }
}

TEST(LocalCommunicator, AllReduceSum) {
  for (int n = 1; n <= 4; ++n) {
    run_ranks(n, [n](Communicator& c) {
      // rank r holds {r, 1, 0.5 r}: sums are n(n-1)/2, n, n(n-1)/4.
      std::vector<float> v = {float(c.rank()), 1.0f, 0.5f * float(c.rank())};
      c.all_reduce_sum(v.data(), v.size());
      EXPECT_EQ(v[0], float(n * (n - 1) / 2));
      EXPECT_EQ(v[1], float(n));
      EXPECT_EQ(v[2], float(n * (n - 1)) / 4.0f);
    });
  }
}

// Rounding depends on the order of a sum: every rank must get the same bits, those of rank order.
TEST(LocalCommunicator, AllReduceSumIsInRankOrderOnEveryRank) {
  const std::vector<float> vals = {1e8f, 1.0f, -1e8f, 1.0f};
  float expect = 0;
  for (float x : vals) expect += x;
  std::vector<float> got(4);
  run_ranks(4, [&](Communicator& c) {
    float v = vals[size_t(c.rank())];
    c.all_reduce_sum(&v, 1);
    got[size_t(c.rank())] = v;
  });
  for (float g : got) EXPECT_EQ(g, expect);
}

TEST(LocalCommunicator, BarrierOrdersWrites) {
  std::vector<int> marks(4, 0);
  run_ranks(4, [&](Communicator& c) {
    marks[size_t(c.rank())] = c.rank() + 1;
    c.barrier();
    for (int p = 0; p < 4; ++p) EXPECT_EQ(marks[size_t(p)], p + 1);
    c.barrier();
  });
}

TEST(LocalCommunicator, MismatchedCountsThrowOnTheReceiver) {
  EXPECT_THROW(run_ranks(2,
                         [](Communicator& c) {
                           std::vector<size_t> send = {4, 4}, recv = {4, c.rank() == 0 ? size_t(8) : 4};
                           std::vector<uint8_t> s(8), r(12);
                           c.all_to_all_v(s.data(), send, r.data(), recv);
                         }),
               Error);
}

// A rank that fails before a collective aborts the group: the others throw instead of waiting.
TEST(LocalCommunicator, AbortReleasesTheOtherRanks) {
  std::mutex mu;
  std::vector<std::string> seen;
  EXPECT_THROW(run_ranks(3,
                         [&](Communicator& c) {
                           if (c.rank() == 1) throw std::runtime_error("rank 1 failed");
                           try {
                             c.barrier();
                           } catch (const Error& e) {
                             std::lock_guard<std::mutex> lock(mu);
                             seen.push_back(e.what());
                             throw;
                           }
                         }),
               std::runtime_error);
  ASSERT_EQ(seen.size(), 2u);
  for (const auto& s : seen) EXPECT_NE(s.find("aborted"), std::string::npos);
}

}  // namespace
}  // namespace beluga
