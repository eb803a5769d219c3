#include "common/rate_limit.h"

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(RateLimitTest, AllowsABurstPerWindowAndCountsWhatItRefused) {
  RateLimit limit(2, absl::Seconds(10));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  int64_t suppressed = -1;
  EXPECT_TRUE(limit.Allow(t0, &suppressed));
  EXPECT_EQ(suppressed, 0);
  EXPECT_TRUE(limit.Allow(t0 + absl::Seconds(1)));
  EXPECT_FALSE(limit.Allow(t0 + absl::Seconds(2)));
  EXPECT_FALSE(limit.Allow(t0 + absl::Seconds(9)));
  EXPECT_TRUE(limit.Allow(t0 + absl::Seconds(10), &suppressed));
  EXPECT_EQ(suppressed, 2);
  EXPECT_TRUE(limit.Allow(t0 + absl::Seconds(11), &suppressed));
  EXPECT_EQ(suppressed, 0);
  EXPECT_FALSE(limit.Allow(t0 + absl::Seconds(12)));
}

}  // namespace
}  // namespace shardcoord
