#include "sharding/sender_assignment.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

// Sender choice itself is covered through Redistribute (planner_test, planner_property_test).
TEST(WaterLevelTest, FillsTheLowestLoadsFirst) {
  EXPECT_DOUBLE_EQ(WaterLevel({0, 0}, 10), 5);
  EXPECT_DOUBLE_EQ(WaterLevel({0, 10}, 10), 10);   // Only the empty holder rises.
  EXPECT_DOUBLE_EQ(WaterLevel({10, 0, 2}, 4), 3);  // 0 and 2 rise to 3; 10 stays above.
  EXPECT_DOUBLE_EQ(WaterLevel({4, 4}, 0), 4);
  EXPECT_DOUBLE_EQ(WaterLevel({6, 2}, 20), 14);  // Both rise: (20 + 8) / 2.
}

}  // namespace
}  // namespace shardcoord
