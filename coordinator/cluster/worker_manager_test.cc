#include "coordinator/cluster/worker_manager.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

struct Lost {
  std::string name;
  int64_t rank;
  int64_t incarnation;
  std::string reason;
};

class RecordingListener : public WorkerListener {
 public:
  void OnWorkerLost(const WorkerRecord& w, const std::string& reason) override {
    lost.push_back({w.spec.name, w.rank, w.incarnation, reason});
  }
  std::vector<Lost> lost;
};

WorkerSpec Spec(const std::string& name, const std::string& host = "h0") {
  return WorkerSpec{name, host, "cpu", name + ":1", "gloo"};
}

class WorkerManagerTest : public ::testing::Test {
 protected:
  WorkerManagerTest() : workers_(&clock_, absl::Seconds(5)) { workers_.AddListener(&listener_); }
  FakeClock clock_;
  WorkerManager workers_;
  RecordingListener listener_;
};

TEST_F(WorkerManagerTest, RanksFollowFirstRegistrationAndIncarnationsIncrease) {
  absl::StatusOr<WorkerRecord> a = workers_.Register(Spec("a"));
  absl::StatusOr<WorkerRecord> b = workers_.Register(Spec("b", "h1"));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->rank, 0);
  EXPECT_EQ(b->rank, 1);
  EXPECT_LT(a->incarnation, b->incarnation);

  // Re-registration keeps the rank, gets a newer incarnation, and the old one is lost.
  absl::StatusOr<WorkerRecord> a2 = workers_.Register(Spec("a"));
  ASSERT_TRUE(a2.ok());
  EXPECT_EQ(a2->rank, 0);
  EXPECT_GT(a2->incarnation, b->incarnation);
  ASSERT_EQ(listener_.lost.size(), 1u);
  EXPECT_EQ(listener_.lost[0].incarnation, a->incarnation);
  EXPECT_THAT(listener_.lost[0].reason, HasSubstr("re-registered"));

  EXPECT_EQ(workers_.Heartbeat("a", a->incarnation).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(workers_.Heartbeat("a", a2->incarnation).ok());
  EXPECT_EQ(workers_.Heartbeat("zz", 1).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(workers_.IsLive(0, a2->incarnation));
  EXPECT_FALSE(workers_.IsLive(0, a->incarnation));
  EXPECT_EQ(workers_.HostsByRank(), (std::vector<std::string>{"h0", "h1"}));
}

TEST_F(WorkerManagerTest, RejectsEmptyNameOrAddress) {
  EXPECT_EQ(workers_.Register(WorkerSpec{"", "h", "cpu", "x:1", "gloo"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(workers_.Register(WorkerSpec{"a", "h", "cpu", "", "gloo"}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(WorkerManagerTest, MissedHeartbeatsMeanDead) {
  absl::StatusOr<WorkerRecord> a = workers_.Register(Spec("a"));
  absl::StatusOr<WorkerRecord> b = workers_.Register(Spec("b"));
  ASSERT_TRUE(a.ok() && b.ok());
  clock_.Advance(absl::Seconds(3));
  ASSERT_TRUE(workers_.Heartbeat("b", b->incarnation).ok());
  clock_.Advance(absl::Seconds(3));
  // a: 6s without a heartbeat (> 5s); b: 3s.
  std::vector<WorkerRecord> dead = workers_.CheckHealth(clock_.Now());
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].spec.name, "a");
  EXPECT_FALSE(workers_.Get("a")->alive);
  EXPECT_TRUE(workers_.Get("b")->alive);
  ASSERT_EQ(listener_.lost.size(), 1u);
  EXPECT_EQ(listener_.lost[0].rank, 0);
  EXPECT_THAT(listener_.lost[0].reason, HasSubstr("no heartbeat for 6s"));

  // Exactly at the timeout is still alive; a dead worker is not reported twice.
  clock_.Advance(absl::Seconds(2));
  EXPECT_TRUE(workers_.CheckHealth(clock_.Now()).empty());
  EXPECT_EQ(listener_.lost.size(), 1u);

  // A dead worker's heartbeat is rejected until it registers again.
  absl::Status hb = workers_.Heartbeat("a", a->incarnation);
  EXPECT_EQ(hb.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(hb.message(), HasSubstr("declared dead"));
  absl::StatusOr<WorkerRecord> a2 = workers_.Register(Spec("a"));
  ASSERT_TRUE(a2.ok());
  EXPECT_TRUE(a2->alive);
  // Registering after death loses nothing more.
  EXPECT_EQ(listener_.lost.size(), 1u);
}

TEST_F(WorkerManagerTest, MarkDeadOnlyHitsTheGivenIncarnation) {
  absl::StatusOr<WorkerRecord> a = workers_.Register(Spec("a"));
  absl::StatusOr<WorkerRecord> a2 = workers_.Register(Spec("a"));
  ASSERT_TRUE(a.ok() && a2.ok());
  listener_.lost.clear();
  ASSERT_TRUE(workers_.MarkDead("a", a->incarnation, "unreachable").ok());
  EXPECT_TRUE(workers_.Get("a")->alive);
  ASSERT_TRUE(workers_.MarkDead("a", a2->incarnation, "unreachable").ok());
  EXPECT_FALSE(workers_.Get("a")->alive);
  ASSERT_EQ(listener_.lost.size(), 1u);
  EXPECT_EQ(listener_.lost[0].reason, "died: unreachable");
  EXPECT_EQ(workers_.GetByRank(7).status().code(), absl::StatusCode::kNotFound);
}

// A restarted coordinator (a new manager over the same store) keeps every name's rank,
// hands out incarnations above all earlier ones, and knows which incarnations were live.
TEST(WorkerManagerStoreTest, RanksSurviveARestart) {
  FakeClock clock;
  MemoryStateStore store;
  int64_t last = 0;
  {
    WorkerManager workers(&clock, absl::Seconds(5), &store);
    ASSERT_TRUE(workers.Load().ok());
    ASSERT_TRUE(workers.Register(Spec("a")).ok());
    ASSERT_TRUE(workers.Register(Spec("b")).ok());
    ASSERT_TRUE(workers.Register(Spec("c")).ok());
    absl::StatusOr<WorkerRecord> b = workers.Get("b");
    ASSERT_TRUE(workers.MarkDead("b", b->incarnation, "gone").ok());
    last = workers.Get("c")->incarnation;
  }
  WorkerManager workers(&clock, absl::Seconds(5), &store);
  ASSERT_TRUE(workers.Load().ok());
  std::vector<WorkerRecord> all = workers.List();
  ASSERT_EQ(all.size(), 3u);
  for (const WorkerRecord& w : all) {
    EXPECT_FALSE(w.alive) << w.Describe();
    EXPECT_THAT(w.death_reason, HasSubstr("coordinator restarted"));
    // Expected back: what needs it is told to retry.
    absl::Status dead = w.DeadError("is dead");
    EXPECT_EQ(dead.code(), absl::StatusCode::kUnavailable) << dead;
    EXPECT_THAT(dead.message(), HasSubstr("retry shortly"));
  }
  EXPECT_TRUE(workers.WasLiveBeforeRestart(0, 1));
  EXPECT_FALSE(workers.WasLiveBeforeRestart(1, 2));  // Declared dead before the restart.
  EXPECT_TRUE(workers.WasLiveBeforeRestart(2, 3));
  EXPECT_FALSE(workers.WasLiveBeforeRestart(2, 2));
  // The old incarnation is refused; registering again keeps the rank, in any order.
  EXPECT_EQ(workers.Heartbeat("c", last).code(), absl::StatusCode::kAborted);
  absl::StatusOr<WorkerRecord> c = workers.Register(Spec("c"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rank, 2);
  EXPECT_GT(c->incarnation, last);
  absl::StatusOr<WorkerRecord> d = workers.Register(Spec("d"));
  EXPECT_EQ(d->rank, 3);
  EXPECT_EQ(workers.Register(Spec("a"))->rank, 0);
  EXPECT_FALSE(workers.Get("c")->awaited);
  // b never comes back: after the recovery timeout it is plainly dead.
  EXPECT_TRUE(workers.Get("b")->awaited);
  workers.EndAwaiting();
  absl::Status dead = workers.Get("b")->DeadError("is dead");
  EXPECT_EQ(dead.code(), absl::StatusCode::kFailedPrecondition) << dead;
  EXPECT_THAT(dead.message(), HasSubstr("did not register again within the recovery timeout"));
}

}  // namespace
}  // namespace shardcoord
