// The decode balancer: KV usage and requests in flight together pick the decode engine.
#include "router/decode_balance.h"

#include <gtest/gtest.h>

#include <vector>

namespace beluga::router {
namespace {

Candidate engine(int id, int in_flight, double kv_usage) {
  Candidate c;
  c.replica = id;
  c.in_flight = in_flight;
  c.kv_usage = kv_usage;
  return c;
}

TEST(DecodeBalance, AnEngineWithItsKvNearlyFullIsAvoidedAtEqualLoad) {
  const CostKnobs k;
  const std::vector<Candidate> c = {engine(0, 2, 0.9), engine(1, 2, 0.1)};
  for (uint64_t t = 0; t < 8; ++t) EXPECT_EQ(choose_decode(c, k, t), 1u);
}

TEST(DecodeBalance, RequestsInFlightOutweighALittleKv) {
  const CostKnobs k;  // a full KV is worth 16 requests: 10% of it, 1.6
  const std::vector<Candidate> c = {engine(0, 0, 0.2), engine(1, 4, 0.1)};
  EXPECT_EQ(choose_decode(c, k, 0), 0u);
}

TEST(DecodeBalance, AFullEngineIsPassedOverWhileAnotherHasRoom) {
  const CostKnobs k;
  // Engine 0 is idle but full: admitting there would queue or preempt; 1 is busy with room.
  const std::vector<Candidate> c = {engine(0, 0, 0.97), engine(1, 30, 0.5)};
  EXPECT_EQ(choose_decode(c, k, 0), 1u);
  // Every engine full: the cheapest of them all.
  const std::vector<Candidate> all_full = {engine(0, 3, 0.99), engine(1, 1, 0.96)};
  EXPECT_EQ(choose_decode(all_full, k, 0), 1u);
}

TEST(DecodeBalance, TiesRotate) {
  const CostKnobs k;
  const std::vector<Candidate> c = {engine(0, 1, 0.25), engine(1, 9, 0.0), engine(2, 1, 0.25),
                                    engine(3, 6, 0.0)};
  EXPECT_EQ(choose_decode(c, k, 0), 0u);
  EXPECT_EQ(choose_decode(c, k, 1), 2u);
  EXPECT_EQ(choose_decode(c, k, 2), 0u);
}

}  // namespace
}  // namespace beluga::router
