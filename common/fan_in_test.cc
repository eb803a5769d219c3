#include "common/fan_in.h"

#include <atomic>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(FanInTest, TheLastReportRunsDoneWithTheFirstError) {
  std::optional<absl::Status> out;
  std::shared_ptr<FanIn> fan = FanIn::Start(3, [&](absl::Status s) { out = s; });
  fan->Report(absl::OkStatus());
  fan->Report(absl::UnavailableError("first"));
  EXPECT_FALSE(out.has_value());
  fan->Report(absl::InternalError("second"));
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(out->message(), "first");
}

TEST(FanInTest, NoCallsIsDoneAtOnce) {
  std::optional<absl::Status> out;
  EXPECT_EQ(FanIn::Start(0, [&](absl::Status s) { out = s; }), nullptr);
  ASSERT_TRUE(out.has_value());
  EXPECT_TRUE(out->ok());
}

TEST(FanInTest, SlotsWrittenBeforeReportsAreSeenByDone) {
  constexpr int kCalls = 16;
  std::vector<int> slots(kCalls, 0);
  std::atomic<int> sum{-1};
  std::shared_ptr<FanIn> fan = FanIn::Start(kCalls, [&](absl::Status s) {
    ASSERT_TRUE(s.ok());
    int total = 0;
    for (int v : slots) total += v;
    sum = total;
  });
  std::vector<std::thread> threads;
  for (int i = 0; i < kCalls; ++i) {
    threads.emplace_back([&, i] {
      slots[i] = i + 1;
      fan->Report(absl::OkStatus());
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(sum.load(), kCalls * (kCalls + 1) / 2);
}

}  // namespace
}  // namespace shardcoord
