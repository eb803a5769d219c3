#include "worker/control/kv_client.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(InMemoryKvClientTest, SetThenGet) {
  InMemoryKvClient kv;
  ASSERT_TRUE(kv.Set("a", std::string("x\0y", 3)).ok());
  auto v = kv.Get("a", absl::ZeroDuration());
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, std::string("x\0y", 3));
  ASSERT_TRUE(kv.Set("a", "z").ok());
  EXPECT_EQ(*kv.Get("a", absl::Seconds(1)), "z");
  EXPECT_EQ(kv.size(), 1);
}

TEST(InMemoryKvClientTest, MissingKey) {
  InMemoryKvClient kv;
  EXPECT_EQ(kv.Get("a", absl::ZeroDuration()).status().code(), absl::StatusCode::kNotFound);
  auto late = kv.Get("a", absl::Milliseconds(20));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.status().message().find("'a'"), std::string::npos);
  EXPECT_EQ(kv.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Get("", absl::ZeroDuration()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(InMemoryKvClientTest, GetWaitsForSet) {
  InMemoryKvClient kv;
  absl::Notification waiting;
  std::string got;
  std::thread reader([&] {
    waiting.Notify();
    auto v = kv.Get("k", absl::Seconds(60));
    if (v.ok()) got = *v;
  });
  waiting.WaitForNotification();
  ASSERT_TRUE(kv.Set("other", "o").ok());  // Wakes the reader, which keeps waiting.
  ASSERT_TRUE(kv.Set("k", "v").ok());
  reader.join();
  EXPECT_EQ(got, "v");
}

}  // namespace
}  // namespace shardcoord
