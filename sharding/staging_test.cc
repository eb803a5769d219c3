#include "sharding/staging.h"

#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"

namespace shardcoord {
namespace {

TEST(StagingTest, CapsAreTwiceTheLargestStepPerRank) {
  Plan plan;
  Step a, b;
  a.transfers.push_back(Transfer{0, 1, Box({0}, {10}), 40, false, 0});
  a.transfers.push_back(Transfer{2, 1, Box({10}, {5}), 20, false, 0});
  b.transfers.push_back(Transfer{1, 0, Box({0}, {25}), 100, false, 0});
  plan.steps = {a, b};
  const std::map<int64_t, int64_t> caps = StagingCaps(plan);
  EXPECT_EQ(caps, (std::map<int64_t, int64_t>{{0, 200}, {1, 200}, {2, 40}}));
  EXPECT_EQ(StagingBytes({200, 40}, 30), 60 + 40);
  EXPECT_EQ(StagingBytes({200, 40}, 1000), 240);
  EXPECT_EQ(StagingBytes({}, 1000), 0);
  EXPECT_EQ(StagingLimit(kDefaultBucketBytes), kBucketsInFlight * kDefaultBucketBytes);
}

TEST(StagingTest, CapsOfARealPlanBoundItsTraffic) {
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({4}, {0, 1, 2, 3}, {"x"});
  ASSERT_TRUE(mesh.ok());
  absl::StatusOr<Layout> from = Layout::FromPlacements(*mesh, {64, 32}, {Placement::Shard(0)});
  absl::StatusOr<Layout> to = Layout::FromPlacements(*mesh, {64, 32}, {Placement::Shard(1)});
  ASSERT_TRUE(from.ok() && to.ok());
  absl::StatusOr<Plan> plan = Redistribute(*from, *to, DType::kF32);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::map<int64_t, int64_t> caps = StagingCaps(*plan);
  for (const RankTraffic& t : plan->traffic) {
    EXPECT_LE(caps.at(t.rank), 2 * (t.bytes_sent + t.bytes_received));
    EXPECT_GT(caps.at(t.rank), 0);
  }
}

TEST(MessageWindowsTest, OneWindowWhenEverythingFits) {
  std::vector<WindowMessage> m = {{0, 1, 10}, {1, 0, 10}, {2, 3, 50}};
  EXPECT_EQ(AssignMessageWindows(m, 100), (std::vector<int>{0, 0, 0}));
  EXPECT_TRUE(AssignMessageWindows({}, 1).empty());
}

TEST(MessageWindowsTest, SplitsWhereARankWouldExceedTheLimit) {
  // Rank 0 sends three 40-byte messages to rank 1 with a limit of 100: two fit a window.
  std::vector<WindowMessage> m = {{0, 1, 40}, {0, 1, 40}, {0, 1, 40}, {2, 3, 40}};
  EXPECT_EQ(AssignMessageWindows(m, 100), (std::vector<int>{0, 0, 1, 0}));
  // A message larger than the limit gets a window where its ends have nothing else.
  std::vector<WindowMessage> big = {{0, 1, 10}, {1, 2, 500}, {0, 2, 10}};
  EXPECT_EQ(AssignMessageWindows(big, 100), (std::vector<int>{0, 1, 2}));
}

// Random exchanges: every rank's load per window within the limit (or one oversized message
// alone), windows never decrease per rank, and the same input gives the same windows.
TEST(MessageWindowsTest, RandomExchangesStayWithinTheLimit) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int ranks = 2 + static_cast<int>(rng() % 6);
    const int64_t limit = 1 + rng() % 200;
    std::vector<WindowMessage> messages;
    const int n = static_cast<int>(rng() % 60);
    for (int i = 0; i < n; ++i) {
      WindowMessage m;
      m.src = rng() % ranks;
      do {
        m.dst = rng() % ranks;
      } while (m.dst == m.src);
      m.bytes = 1 + rng() % (limit + limit / 2);
      messages.push_back(m);
    }
    const std::vector<int> w = AssignMessageWindows(messages, limit);
    ASSERT_EQ(w.size(), messages.size());
    EXPECT_EQ(w, AssignMessageWindows(messages, limit));
    std::map<std::pair<int, int64_t>, std::pair<int64_t, int>> load;  // (window, rank) -> bytes, n
    std::map<int64_t, int> last;
    for (size_t i = 0; i < messages.size(); ++i) {
      for (int64_t r : {messages[i].src, messages[i].dst}) {
        auto& [bytes, count] = load[{w[i], r}];
        bytes += messages[i].bytes;
        ++count;
        EXPECT_GE(w[i], last[r]) << "trial " << trial << " message " << i;
        last[r] = w[i];
      }
    }
    for (const auto& [key, value] : load) {
      const auto& [bytes, count] = value;
      EXPECT_TRUE(bytes <= limit || count == 1)
          << "trial " << trial << " window " << key.first << " rank " << key.second << ": " << bytes
          << " bytes in " << count << " messages, limit " << limit;
    }
  }
}

}  // namespace
}  // namespace shardcoord
