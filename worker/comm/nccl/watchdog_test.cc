// The watchdog against a fake NCCL and a fake clock: completion, errors, timeouts and
// cancellation, each ending in exactly one ncclCommAbort, and no real time spent.
#include "worker/comm/nccl/watchdog.h"

#include <atomic>
#include <string>

#include "common/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/nccl/fake_nccl_api.h"

namespace shardcoord {
namespace nccl {
namespace {

using ::testing::HasSubstr;

class WatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string id(kNcclUniqueIdBytes, 'x');
    ASSERT_EQ(api_.CommInitRank(&comm_, 2, id, 0), NcclResult::kSuccess);
    ASSERT_TRUE(api_.StreamCreate(&stream_).ok());
    ASSERT_TRUE(api_.EventCreate(&event_).ok());
  }

  WatchdogOptions Options(int spin) {
    WatchdogOptions o;
    o.spin_polls = spin;
    o.poll_interval = absl::Milliseconds(1);
    return o;
  }

  OpLabel Label() {
    return OpLabel{"AllReduce", true, 42, "group [3,5] (prefix 'plan-7')", absl::Seconds(2)};
  }

  // A watchdog spinning `spin` polls awaits `event` (null: the communicator's own progress)
  // for two seconds from now.
  absl::Status Await(GpuEvent event, int spin = 0, const std::atomic<bool>* cancel = nullptr) {
    NcclWatchdog w(&api_, &clock_, Options(spin));
    return w.Await(comm_, event, clock_.Now() + absl::Seconds(2), Label(), cancel);
  }

  // `st` has `code` and a message containing `part`, and the communicator was aborted once.
  void ExpectAborted(const absl::Status& st, absl::StatusCode code, const std::string& part) {
    EXPECT_EQ(st.code(), code);
    EXPECT_THAT(std::string(st.message()), HasSubstr(part));
    EXPECT_EQ(api_.aborted_comms(), 1);
  }

  // Starts the event's countdown as an op's EventRecord does.
  void Record() { ASSERT_TRUE(api_.EventRecord(event_, stream_).ok()); }
  // Scripts the event to stay pending for `polls` queries (-1: for ever), then Record().
  void RecordPending(int polls) {
    FakeNcclApi::Script s;
    s.event_pending_polls = polls;
    api_.SetScript(s);
    Record();
  }

  FakeNcclApi api_;
  FakeClock clock_;
  NcclComm comm_ = nullptr;
  GpuStream stream_ = nullptr;
  GpuEvent event_ = nullptr;
};

TEST_F(WatchdogTest, CompletesWithoutSleepingWhileSpinning) {
  RecordPending(5);
  EXPECT_TRUE(Await(event_, 100).ok());
  EXPECT_EQ(api_.event_polls(), 6);
  EXPECT_EQ(clock_.slept(), absl::ZeroDuration());
  EXPECT_EQ(api_.aborted_comms(), 0);
}

TEST_F(WatchdogTest, SleepsOnePollIntervalPerPollAfterSpinning) {
  RecordPending(10);
  EXPECT_TRUE(Await(event_, 4).ok());
  // 10 pending polls: the first 4 spin, the other 6 are each followed by a sleep.
  EXPECT_EQ(clock_.slept(), absl::Milliseconds(6));
}

TEST_F(WatchdogTest, WaitsForEnqueueBeforeLookingAtTheEvent) {
  FakeNcclApi::Script s;
  s.in_progress_polls = 3;
  api_.SetScript(s);
  ASSERT_EQ(api_.GroupStart(), NcclResult::kSuccess);
  NcclCall call;
  ASSERT_EQ(api_.Issue(call, comm_, stream_), NcclResult::kSuccess);
  ASSERT_EQ(api_.GroupEnd(), NcclResult::kInProgress);
  EXPECT_TRUE(Await(nullptr).ok());
  EXPECT_EQ(api_.async_polls(), 4);
  EXPECT_EQ(api_.event_polls(), 0);
}

TEST_F(WatchdogTest, TimeoutAbortsAndNamesOpTagAndGroup) {
  RecordPending(-1);  // The GPU never finishes: a peer is gone.
  const absl::Time start = clock_.Now();
  absl::Status st = Await(event_);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(st.message(),
            "NCCL AllReduce (tag 42) on group [3,5] (prefix 'plan-7') did not complete within "
            "2s (enqueued, waiting for the GPU); communicator aborted");
  EXPECT_EQ(api_.aborted_comms(), 1);
  EXPECT_GE(clock_.Now(), start + absl::Seconds(2));
  EXPECT_LE(clock_.Now(), start + absl::Seconds(2) + absl::Milliseconds(1));
}

TEST_F(WatchdogTest, StuckInProgressTimesOut) {
  FakeNcclApi::Script s;
  s.in_progress_polls = -1;
  api_.SetScript(s);
  NcclCall call;
  ASSERT_EQ(api_.Issue(call, comm_, stream_), NcclResult::kInProgress);
  ExpectAborted(Await(nullptr), absl::StatusCode::kDeadlineExceeded, "(still in ncclInProgress)");
}

TEST_F(WatchdogTest, AsyncErrorAbortsWithNcclsExplanation) {
  FakeNcclApi::Script s;
  s.event_pending_polls = -1;
  s.async_error_after = 3;
  s.async_error = NcclResult::kRemoteError;
  s.last_error = "NET/Socket : peer 10.0.0.7 closed the connection";
  api_.SetScript(s);
  Record();
  absl::Status st = Await(event_);
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(st.message(),
            "NCCL AllReduce (tag 42) on group [3,5] (prefix 'plan-7') failed: ncclRemoteError: "
            "remote process exited or there was a network error (NET/Socket : peer 10.0.0.7 "
            "closed the connection); communicator aborted");
  EXPECT_EQ(api_.async_polls(), 4);
  EXPECT_EQ(api_.aborted_comms(), 1);
  EXPECT_EQ(clock_.slept(), absl::Milliseconds(3));  // Found long before the deadline.
}

TEST_F(WatchdogTest, EventErrorAborts) {
  FakeNcclApi::Script s;
  s.event_query = absl::InternalError("cudaEventQuery: an illegal memory access was encountered");
  api_.SetScript(s);
  Record();
  ExpectAborted(Await(event_), absl::StatusCode::kAborted,
                "failed: cudaEventQuery: an illegal memory");
}

TEST_F(WatchdogTest, CancelAborts) {
  RecordPending(-1);
  std::atomic<bool> cancel{true};
  ExpectAborted(Await(event_, 0, &cancel), absl::StatusCode::kAborted,
                "was cancelled by an abort request");
}

TEST_F(WatchdogTest, AsyncErrorIsSeenEvenAfterTheDeadline) {
  // A deadline already past still reports the real cause when NCCL knows it.
  FakeNcclApi::Script s;
  s.async_error_after = 0;
  s.async_error = NcclResult::kSystemError;
  api_.SetScript(s);
  NcclWatchdog w(&api_, &clock_, Options(0));
  absl::Status st = w.Await(comm_, nullptr, clock_.Now() - absl::Seconds(1), Label());
  EXPECT_EQ(st.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(st.message()), HasSubstr("ncclSystemError"));
}

TEST_F(WatchdogTest, NeverTouchesTheCommunicatorAfterAborting) {
  RecordPending(-1);
  NcclWatchdog w(&api_, &clock_, Options(0));
  (void)w.Await(comm_, event_, clock_.Now() + absl::Milliseconds(5), Label());
  EXPECT_TRUE(api_.misuse().empty()) << api_.misuse()[0];
  EXPECT_EQ(api_.op_calls().back(), "ncclCommAbort");
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
