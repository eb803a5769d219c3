#include "common/start_end_join.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(StartEndJoinTest, AnEndBeforeTheStartWaitsForIt) {
  std::vector<std::string> seen;
  StartEndJoin<int> join([&](int v) { seen.push_back("end " + std::to_string(v)); });
  join.Ended(7);  // Inline, before the start returned.
  EXPECT_TRUE(seen.empty());
  seen.push_back("started");
  join.Started();
  EXPECT_EQ(seen, (std::vector<std::string>{"started", "end 7"}));
}

TEST(StartEndJoinTest, AnEndAfterTheStartRunsAtOnce) {
  int got = 0;
  StartEndJoin<int> join([&](int v) { got = v; });
  join.Started();
  EXPECT_EQ(got, 0);
  join.Ended(3);
  EXPECT_EQ(got, 3);
}

TEST(StartEndJoinTest, RacingThreadsRunTheEndExactlyOnce) {
  for (int i = 0; i < 200; ++i) {
    std::atomic<int> runs{0};
    StartEndJoin<int> join([&](int) { runs.fetch_add(1); });
    std::thread ender([&] { join.Ended(1); });
    join.Started();
    ender.join();
    EXPECT_EQ(runs.load(), 1);
  }
}

}  // namespace
}  // namespace shardcoord
