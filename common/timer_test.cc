#include "common/timer.h"

#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(FakeTimerTest, RunsDueCallbacksInTimeOrderWithTheClockAtTheirTime) {
  FakeClock clock;
  FakeTimer timer(&clock);
  const absl::Time t0 = clock.Now();
  std::vector<std::pair<int, absl::Time>> ran;
  timer.Schedule(t0 + absl::Seconds(3), [&] { ran.push_back({3, clock.Now()}); });
  timer.Schedule(t0 + absl::Seconds(1), [&] { ran.push_back({1, clock.Now()}); });
  const Timer::Id cancelled = timer.Schedule(t0 + absl::Seconds(2), [&] {
    ran.push_back({2, clock.Now()});
  });
  EXPECT_TRUE(timer.Cancel(cancelled));
  EXPECT_FALSE(timer.Cancel(cancelled));

  timer.Advance(absl::Seconds(2));
  ASSERT_EQ(ran.size(), 1u);
  EXPECT_EQ(ran[0].first, 1);
  EXPECT_EQ(ran[0].second, t0 + absl::Seconds(1));
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(2));
  EXPECT_EQ(timer.pending(), 1u);

  timer.Advance(absl::Seconds(5));
  ASSERT_EQ(ran.size(), 2u);
  EXPECT_EQ(ran[1].first, 3);
  EXPECT_EQ(ran[1].second, t0 + absl::Seconds(3));
  EXPECT_EQ(timer.pending(), 0u);
}

TEST(FakeTimerTest, CallbacksMayScheduleMore) {
  FakeClock clock;
  FakeTimer timer(&clock);
  int runs = 0;
  std::function<void()> again = [&] {
    if (++runs < 3) timer.Schedule(clock.Now() + absl::Seconds(1), again);
  };
  timer.Schedule(clock.Now() + absl::Seconds(1), again);
  timer.Advance(absl::Seconds(10));
  EXPECT_EQ(runs, 3);
}

TEST(ThreadTimerTest, RunsAPastDeadlineAndSkipsACancelledOne) {
  ThreadTimer timer;
  absl::Notification ran;
  bool cancelled_ran = false;
  // Scheduled in the far future and cancelled: must never run.
  const Timer::Id id = timer.Schedule(absl::Now() + absl::Hours(1), [&] { cancelled_ran = true; });
  EXPECT_TRUE(timer.Cancel(id));
  timer.Schedule(absl::Now() - absl::Seconds(1), [&] { ran.Notify(); });
  ran.WaitForNotification();
  timer.Stop();
  EXPECT_FALSE(cancelled_ran);
  // After Stop nothing is scheduled.
  EXPECT_EQ(timer.Schedule(absl::Now(), [] {}), 0);
}

}  // namespace
}  // namespace shardcoord
