#include "coordinator/rpc/request_log.h"

#include <cstdlib>
#include <memory>
#include <string>

#include "common/clock.h"
#include "coordinator/store/sqlite_state_store.h"
#include "coordinator/store/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TEST(RequestLogTest, NoIdAlwaysActs) {
  FakeClock clock;
  RequestLog log(nullptr, &clock);
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::optional<RequestOutcome>> b = log.Begin("", "CreateMesh", "f");
    ASSERT_TRUE(b.ok());
    EXPECT_FALSE(b->has_value());
    EXPECT_TRUE(log.Finish("", {absl::OkStatus(), "x"}).ok());
  }
  EXPECT_EQ(log.size(), 0u);
}

TEST(RequestLogTest, RetryReplaysTheFirstOutcome) {
  FakeClock clock;
  MemoryStateStore store;
  RequestLog log(&store, &clock);
  ASSERT_FALSE(log.Begin("r1", "CreateMesh", "f1")->has_value());
  // A retry while the first is running is told to come back.
  absl::Status running = log.Begin("r1", "CreateMesh", "f1").status();
  EXPECT_EQ(running.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(running.message(), HasSubstr("'r1' is still running"));
  ASSERT_TRUE(log.Finish("r1", {absl::OkStatus(), "mesh-info"}).ok());
  absl::StatusOr<std::optional<RequestOutcome>> again = log.Begin("r1", "CreateMesh", "f1");
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE(again->has_value());
  EXPECT_TRUE((*again)->status.ok());
  EXPECT_EQ((*again)->response, "mesh-info");
  // A failure that would fail again is replayed too, without a response.
  ASSERT_FALSE(log.Begin("r2", "DeleteTensor", "f2")->has_value());
  ASSERT_TRUE(log.Finish("r2", {absl::NotFoundError("unknown tensor 'T'"), "junk"}).ok());
  again = log.Begin("r2", "DeleteTensor", "f2");
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_EQ((*again)->status, absl::NotFoundError("unknown tensor 'T'"));
  EXPECT_EQ((*again)->response, "");
}

TEST(RequestLogTest, TryAgainOutcomesAreForgotten) {
  FakeClock clock;
  RequestLog log(nullptr, &clock);
  for (absl::Status s : {absl::UnavailableError("recovering"), absl::AbortedError("busy"),
                         absl::DeadlineExceededError("slow"), absl::CancelledError("gone")}) {
    ASSERT_FALSE(log.Begin("r", "Redistribute", "f")->has_value()) << s;
    ASSERT_TRUE(log.Finish("r", {s, ""}).ok());
    EXPECT_EQ(log.size(), 0u) << s;
  }
  ASSERT_FALSE(log.Begin("r", "Redistribute", "f")->has_value());
}

TEST(RequestLogTest, AnIdIsForOneRequest) {
  FakeClock clock;
  RequestLog log(nullptr, &clock);
  ASSERT_FALSE(log.Begin("r", "CreateTensor", "f1")->has_value());
  ASSERT_TRUE(log.Finish("r", {absl::OkStatus(), ""}).ok());
  absl::Status other = log.Begin("r", "CreateTensor", "f2").status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.message(), HasSubstr("'r' was already used for another CreateTensor"));
  other = log.Begin("r", "DeleteTensor", "f1").status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.message(), HasSubstr("already used for CreateTensor"));
  other =
      log.Begin(std::string(RequestLog::kMaxRequestIdBytes + 1, 'x'), "CreateTensor", "f").status();
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(other.message(), HasSubstr("request_id: 129 bytes"));
}

TEST(RequestLogTest, OldestOutcomesAreForgottenBeyondCapacity) {
  FakeClock clock;
  MemoryStateStore store;
  RequestLog log(&store, &clock, /*capacity=*/2);
  for (const char* id : {"a", "b", "c"}) {
    ASSERT_FALSE(log.Begin(id, "DeleteMesh", "f")->has_value());
    ASSERT_TRUE(log.Finish(id, {absl::OkStatus(), id}).ok());
    clock.SleepFor(absl::Seconds(1));
  }
  EXPECT_EQ(log.size(), 2u);
  EXPECT_FALSE(log.Begin("a", "DeleteMesh", "f")->has_value());  // Forgotten: acts again.
  EXPECT_EQ(store.Load("request")->size(), 2u);
}

// Outcomes survive a restart, in SQLite, with the order that decides what is forgotten.
TEST(RequestLogTest, OutcomesSurviveARestart) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/requests";
  FakeClock clock;
  {
    absl::StatusOr<std::unique_ptr<SqliteStateStore>> store = SqliteStateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    RequestLog log(store->get(), &clock, /*capacity=*/2);
    ASSERT_TRUE(log.Load().ok());
    for (const char* id : {"a", "b"}) {
      ASSERT_FALSE(log.Begin(id, "Copy", "f")->has_value());
      ASSERT_TRUE(log.Finish(id, {absl::OkStatus(), std::string("resp-") + id}).ok());
      clock.SleepFor(absl::Seconds(1));
    }
    ASSERT_FALSE(log.Begin("running", "Copy", "f")->has_value());  // Never finished.
  }
  absl::StatusOr<std::unique_ptr<SqliteStateStore>> store = SqliteStateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  RequestLog log(store->get(), &clock, /*capacity=*/2);
  ASSERT_TRUE(log.Load().ok());
  absl::StatusOr<std::optional<RequestOutcome>> b = log.Begin("b", "Copy", "f");
  ASSERT_TRUE(b.ok() && b->has_value());
  EXPECT_EQ((*b)->response, "resp-b");
  // A request that was running at the stop never took effect (its plan aborted): it acts.
  EXPECT_FALSE(log.Begin("running", "Copy", "f")->has_value());
  ASSERT_TRUE(log.Finish("running", {absl::OkStatus(), ""}).ok());
  // "a" was the oldest: it goes first.
  EXPECT_FALSE(log.Begin("a", "Copy", "f")->has_value());
}

}  // namespace
}  // namespace shardcoord
