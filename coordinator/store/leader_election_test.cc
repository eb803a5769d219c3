#include "coordinator/store/leader_election.h"

#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "coordinator/testing/fake_etcd.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using State = LeaderElection::State;

constexpr char kKey[] = "/t/leader";

LeaderElectionOptions Options(const std::string& address) {
  LeaderElectionOptions o = TestElectionOptions(kKey, address);
  o.poll = absl::Milliseconds(200);
  return o;
}

class LeaderElectionTest : public ::testing::Test {
 protected:
  LeaderElectionTest()
      : etcd_(&clock_),
        client_a_(etcd_.NewClient()),
        client_b_(etcd_.NewClient()),
        a_(client_a_.get(), &clock_, Options("a:1")),
        b_(client_b_.get(), &clock_, Options("b:2")) {}

  // Moves time in steps of `step` for `total`, running a round of each election given.
  void Run(absl::Duration total, absl::Duration step, std::initializer_list<LeaderElection*> es) {
    for (absl::Duration t = absl::ZeroDuration(); t < total; t += step) {
      clock_.Advance(step);
      for (LeaderElection* e : es) e->Step();
    }
  }

  FakeClock clock_;
  FakeEtcd etcd_;
  std::unique_ptr<EtcdClient> client_a_, client_b_;
  LeaderElection a_, b_;
};

TEST(LeaderValueTest, NamesTheAddress) {
  EXPECT_EQ(LeaderAddress(LeaderValue("10.0.0.1:7400", "c0")), "10.0.0.1:7400");
  EXPECT_EQ(LeaderAddress("name=x\n"), "");
  EXPECT_EQ(LeaderAddress(""), "");
}

TEST_F(LeaderElectionTest, FirstCandidateLeadsTheOtherSeesIt) {
  a_.Step();
  EXPECT_EQ(a_.state(), State::kLeading);
  b_.Step();
  EXPECT_EQ(b_.state(), State::kCampaigning);
  EXPECT_EQ(LeaderAddress(b_.leader_value()), "a:1");
  std::optional<etcdv3::KeyValue> key = etcd_.Get(kKey);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(key->lease(), a_.lease_id());
  EXPECT_EQ(key->create_revision(), a_.create_revision());
  absl::StatusOr<etcdv3::Compare> fence = a_.Fence();
  ASSERT_TRUE(fence.ok()) << fence.status();
  EXPECT_EQ(fence->create_revision(), a_.create_revision());
  EXPECT_EQ(b_.Fence().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(LeaderElectionTest, KeepaliveHoldsLeadershipForever) {
  a_.Step();
  b_.Step();
  Run(absl::Seconds(60), absl::Milliseconds(500), {&a_, &b_});
  EXPECT_EQ(a_.state(), State::kLeading);
  EXPECT_EQ(b_.state(), State::kCampaigning);
  EXPECT_TRUE(a_.Fence().ok());
}

TEST_F(LeaderElectionTest, StandbyTakesOverOnceTheLeadersLeaseExpires) {
  a_.Step();
  b_.Step();
  // a stops (killed): no more keepalives. b wins only once etcd expired a's lease.
  Run(absl::Milliseconds(2800), absl::Milliseconds(200), {&b_});
  EXPECT_EQ(b_.state(), State::kCampaigning);
  Run(absl::Milliseconds(400), absl::Milliseconds(200), {&b_});
  EXPECT_EQ(b_.state(), State::kLeading);
  EXPECT_EQ(LeaderAddress(b_.leader_value()), "b:2");
  // a comes back (it was only stopped): its own clock already told it to stop acting.
  EXPECT_EQ(a_.Fence().status().code(), absl::StatusCode::kUnavailable);
  a_.Step();
  EXPECT_EQ(a_.state(), State::kLost);
  EXPECT_FALSE(a_.lost_reason().empty());
}

TEST_F(LeaderElectionTest, LeaderStopsOnItsOwnClockBeforeEtcdCouldExpireIt) {
  a_.Step();
  etcd_.set_down(true);
  // 5/6 of the 3 s TTL after the last keepalive was sent.
  Run(absl::Milliseconds(2400), absl::Milliseconds(100), {&a_});
  EXPECT_EQ(a_.state(), State::kLeading);
  Run(absl::Milliseconds(200), absl::Milliseconds(100), {&a_});
  EXPECT_EQ(a_.state(), State::kLost);
  EXPECT_NE(a_.lost_reason().find("no answer from etcd"), std::string::npos) << a_.lost_reason();
  EXPECT_EQ(a_.Fence().status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(LeaderElectionTest, RidesOutAShortEtcdOutage) {
  a_.Step();
  b_.Step();
  etcd_.set_down(true);
  Run(absl::Seconds(2), absl::Milliseconds(100), {&a_, &b_});
  EXPECT_EQ(a_.state(), State::kLeading);
  EXPECT_FALSE(a_.last_error().empty());
  etcd_.set_down(false);
  Run(absl::Seconds(30), absl::Milliseconds(100), {&a_, &b_});
  EXPECT_EQ(a_.state(), State::kLeading);
  EXPECT_EQ(b_.state(), State::kCampaigning);
  EXPECT_TRUE(a_.Fence().ok());
  EXPECT_TRUE(a_.last_error().empty()) << a_.last_error();
}

TEST_F(LeaderElectionTest, ADeletedLeaderKeyEndsLeadership) {
  a_.Step();
  etcd_.Delete(kKey);
  Run(absl::Seconds(1), absl::Milliseconds(100), {&a_});
  EXPECT_EQ(a_.state(), State::kLost);
  EXPECT_NE(a_.lost_reason().find("deleted"), std::string::npos) << a_.lost_reason();
}

TEST_F(LeaderElectionTest, FenceFailedEndsLeadershipAtOnce) {
  a_.Step();
  a_.FenceFailed("a write was refused");
  EXPECT_EQ(a_.state(), State::kLost);
  EXPECT_EQ(a_.lost_reason(), "a write was refused");
  EXPECT_FALSE(a_.Fence().ok());
}

TEST_F(LeaderElectionTest, ResignLetsTheStandbyWinWithoutWaiting) {
  a_.Step();
  b_.Step();
  ASSERT_TRUE(a_.Resign().ok());
  EXPECT_EQ(a_.state(), State::kStopped);
  EXPECT_FALSE(etcd_.Get(kKey).has_value());
  b_.Step();
  EXPECT_EQ(b_.state(), State::kLeading);
}

TEST_F(LeaderElectionTest, ATakeWhoseAnswerWasLostIsRecognised) {
  a_.Step();  // Lease granted; the take's answer is lost after it applied.
  ASSERT_TRUE(a_.Resign().ok());
  LeaderElection c(client_a_.get(), &clock_, Options("c:3"));
  etcd_.FailNextTxn(absl::UnknownError("connection reset"), /*apply_first=*/true);
  c.Step();
  EXPECT_EQ(c.state(), State::kCampaigning);
  EXPECT_NE(c.last_error().find("connection reset"), std::string::npos) << c.last_error();
  clock_.Advance(absl::Milliseconds(200));
  c.Step();
  EXPECT_EQ(c.state(), State::kLeading);
  EXPECT_EQ(c.create_revision(), etcd_.Get(kKey)->create_revision());
}

TEST_F(LeaderElectionTest, ACandidateWhoseLeaseExpiredTakesANewOne) {
  a_.Step();
  b_.Step();
  const int64_t first = b_.lease_id();
  etcd_.ExpireLease(first);
  Run(absl::Seconds(2), absl::Milliseconds(200), {&a_, &b_});
  EXPECT_NE(b_.lease_id(), first);
  EXPECT_NE(b_.lease_id(), 0);
  EXPECT_EQ(b_.state(), State::kCampaigning);
}

TEST(LeaderElectionThreadTest, LossIsReportedOnTheElectionsThread) {
  RealClock clock;
  FakeEtcd etcd(&clock);
  std::unique_ptr<EtcdClient> client = etcd.NewClient();
  LeaderElectionOptions o = Options("a:1");
  absl::Notification lost;
  std::string why;
  o.on_lost = [&](const std::string& w) {
    why = w;
    lost.Notify();
  };
  LeaderElection e(client.get(), &clock, o);
  e.Start();
  ASSERT_EQ(e.AwaitDecided(), State::kLeading);
  e.FenceFailed("test");
  lost.WaitForNotification();
  EXPECT_EQ(why, "test");
  e.Stop();
}

}  // namespace
}  // namespace shardcoord
