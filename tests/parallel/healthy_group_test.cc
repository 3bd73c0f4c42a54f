// The group size an expert-parallel instance restarts with after ranks failed: the largest size not
// above the healthy ranks that the routed experts split over (evenly with EPLB), never more ranks
// than experts; one rank when nothing larger fits; none without a healthy rank.
#include <gtest/gtest.h>

#include "parallel/healthy_group.h"

namespace beluga {
namespace {

TEST(HealthyGroup, LargestSizeTheHealthyRanksAllow) {
  // Contiguous sharding takes any size up to the experts (uneven splits allowed).
  EXPECT_EQ(healthy_group_size(3, 64, false), 3);
  EXPECT_EQ(healthy_group_size(7, 64, false), 7);
  EXPECT_EQ(healthy_group_size(12, 8, false), 8);  // each rank keeps at least one expert
  // EPLB's slots need an even split: 64 experts over 7 healthy ranks restart over 4; 6 over 5 -> 3.
  EXPECT_EQ(healthy_group_size(7, 64, true), 4);
  EXPECT_EQ(healthy_group_size(5, 6, true), 3);
  EXPECT_EQ(healthy_group_size(2, 16, true), 2);
  EXPECT_EQ(healthy_group_size(4, 7, true), 1);  // a prime count over fewer ranks: one rank holds all
  EXPECT_EQ(healthy_group_size(1, 64, true), 1);
  EXPECT_EQ(healthy_group_size(0, 64, false), 0);
}

}  // namespace
}  // namespace beluga
