#include "common/clock.h"

#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(FakeClockTest, StartsWhereToldAndMovesOnlyWhenTold) {
  const absl::Time start = absl::FromUnixSeconds(42);
  FakeClock clock(start);
  EXPECT_EQ(clock.Now(), start);
  EXPECT_EQ(clock.Now(), start);
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(clock.Now(), start + absl::Seconds(3));
  clock.Set(start - absl::Seconds(1));
  EXPECT_EQ(clock.Now(), start - absl::Seconds(1));
  EXPECT_EQ(clock.slept(), absl::ZeroDuration());
}

TEST(FakeClockTest, SleepForAdvancesTimeAndCountsSleeps) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  Clock& as_clock = clock;
  as_clock.SleepFor(absl::Milliseconds(5));
  as_clock.SleepFor(absl::Milliseconds(2));
  clock.Advance(absl::Seconds(1));
  EXPECT_EQ(as_clock.Now(), start + absl::Seconds(1) + absl::Milliseconds(7));
  EXPECT_EQ(clock.slept(), absl::Milliseconds(7));
}

TEST(FakeClockTest, ConcurrentSleepsAllCount) {
  FakeClock clock;
  const absl::Time start = clock.Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&clock] {
      for (int i = 0; i < 100; ++i) clock.SleepFor(absl::Milliseconds(1));
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(clock.Now(), start + absl::Milliseconds(400));
  EXPECT_EQ(clock.slept(), absl::Milliseconds(400));
}

}  // namespace
}  // namespace shardcoord
