#include "coordinator/rpc/caller_quota.h"

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(CallerQuotaTest, BoundsEachCallerAlone) {
  CallerQuota quota("watch streams", "--max-watches-per-caller", 2);
  ASSERT_TRUE(quota.Acquire("alice").ok());
  ASSERT_TRUE(quota.Acquire("alice").ok());
  absl::Status third = quota.Acquire("alice");
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(third.message(),
            "caller 'alice' holds 2 watch streams, the limit per caller "
            "(--max-watches-per-caller=2); wait for one to end");
  EXPECT_TRUE(quota.Acquire("bob").ok());  // Another caller is not affected.
  quota.Release("alice");
  EXPECT_EQ(quota.held("alice"), 1);
  EXPECT_TRUE(quota.Acquire("alice").ok());
  quota.Release("nobody");  // Unknown: nothing happens.
  EXPECT_EQ(quota.held("nobody"), 0);
  quota.Release("bob");
  EXPECT_EQ(quota.held("bob"), 0);
}

}  // namespace
}  // namespace shardcoord
