#include "common/duration_flag.h"

#include <string>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(DurationFlagTest, ParsesPositiveDurations) {
  absl::Duration d;
  ASSERT_TRUE(ParseDurationFlag("step-timeout", "60s", &d).ok());
  EXPECT_EQ(d, absl::Seconds(60));
  ASSERT_TRUE(ParseDurationFlag("step-timeout", "500ms", &d).ok());
  EXPECT_EQ(d, absl::Milliseconds(500));
  ASSERT_TRUE(ParseDurationFlag("step-timeout", "1m30s", &d).ok());
  EXPECT_EQ(d, absl::Seconds(90));
  ASSERT_TRUE(ParseDurationFlag("step-timeout", "inf", &d).ok());  // No limit.
  EXPECT_EQ(d, absl::InfiniteDuration());
}

TEST(DurationFlagTest, RejectsTheRestNamingTheFlag) {
  for (const char* text : {"", "60", "soon", "0", "0s", "-5s", "-inf"}) {
    absl::Duration d = absl::Seconds(7);
    absl::Status s = ParseDurationFlag("plan-timeout", text, &d);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(s.message(), std::string("--plan-timeout: '") + text +
                               "' is not a positive duration (e.g. 60s, 500ms)");
    EXPECT_EQ(d, absl::Seconds(7)) << text;  // Unchanged.
  }
}

}  // namespace
}  // namespace shardcoord
