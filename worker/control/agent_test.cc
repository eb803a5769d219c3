#include "worker/control/agent.h"

#include <atomic>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

// Scripted coordinator: registration and heartbeat answers are queued by the test; with an
// empty queue registration succeeds and heartbeats are OK.
class FakeRpc : public CoordinatorAgentRpc {
 public:
  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) override {
    absl::MutexLock lock(&mu_);
    last_registration_ = request;
    if (register_down_) return absl::UnavailableError("down");
    if (!register_errors_.empty()) {
      absl::Status s = register_errors_.front();
      register_errors_.pop_front();
      return s;
    }
    v1::RegisterWorkerResponse r;
    r.set_rank(5);
    r.set_incarnation(++incarnation_);
    r.set_heartbeat_interval_ms(interval_ms_);
    return r;
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest& request) override {
    absl::MutexLock lock(&mu_);
    beats_.push_back(request);
    if (!beat_errors_.empty()) {
      absl::Status s = beat_errors_.front();
      beat_errors_.pop_front();
      return s;
    }
    return absl::OkStatus();
  }

  void WaitBeats(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return beats_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
  }

  absl::Mutex mu_;
  int64_t incarnation_ ABSL_GUARDED_BY(mu_) = 100;
  int64_t interval_ms_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<absl::Status> register_errors_ ABSL_GUARDED_BY(mu_);
  bool register_down_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<absl::Status> beat_errors_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::HeartbeatRequest> beats_ ABSL_GUARDED_BY(mu_);
  v1::RegisterWorkerRequest last_registration_ ABSL_GUARDED_BY(mu_);
};

AgentOptions Options() {
  AgentOptions o;
  o.registration.set_name("w1");
  o.registration.set_host("h");
  o.registration.set_device("cpu");
  o.registration.set_address("127.0.0.1:9");
  o.registration.set_backend("gloo");
  o.retry_interval = absl::Milliseconds(1);
  return o;
}

TEST(AgentTest, RegistersAndHeartbeats) {
  FakeRpc rpc;
  Agent agent(&rpc, Options());
  ASSERT_TRUE(agent.Start(absl::Seconds(30)).ok());
  EXPECT_EQ(agent.identity().rank, 5);
  EXPECT_EQ(agent.identity().incarnation, 101);
  EXPECT_EQ(agent.identity().name, "w1");
  rpc.WaitBeats(3);
  agent.Stop();
  absl::MutexLock lock(&rpc.mu_);
  EXPECT_EQ(rpc.last_registration_.address(), "127.0.0.1:9");
  for (const auto& b : rpc.beats_) {
    EXPECT_EQ(b.name(), "w1");
    EXPECT_EQ(b.incarnation(), 101);
  }
}

TEST(AgentTest, ReportsMemoryWithRegistrationAndEveryHeartbeat) {
  FakeRpc rpc;
  AgentOptions o = Options();
  std::atomic<int64_t> used{100};
  o.memory = [&used] {
    MemoryReport m;
    m.budget_bytes = 1000;
    m.used_bytes = used.fetch_add(1);
    m.peak_bytes = 500;
    return m;
  };
  Agent agent(&rpc, o);
  ASSERT_TRUE(agent.Start(absl::Seconds(30)).ok());
  rpc.WaitBeats(2);
  agent.Stop();
  absl::MutexLock lock(&rpc.mu_);
  EXPECT_EQ(rpc.last_registration_.memory_budget_bytes(), 1000);
  EXPECT_EQ(rpc.last_registration_.memory_used_bytes(), 100);
  EXPECT_EQ(rpc.last_registration_.memory_peak_bytes(), 500);
  int64_t last = 100;
  for (const auto& b : rpc.beats_) {
    EXPECT_EQ(b.memory_budget_bytes(), 1000);
    EXPECT_GT(b.memory_used_bytes(), last);  // Taken when each beat is sent.
    last = b.memory_used_bytes();
    EXPECT_EQ(b.memory_peak_bytes(), 500);
  }
}

TEST(AgentTest, StaleIncarnationRegistersAgain) {
  FakeRpc rpc;
  {
    absl::MutexLock lock(&rpc.mu_);
    rpc.beat_errors_.push_back(absl::OkStatus());
    rpc.beat_errors_.push_back(absl::AbortedError("stale incarnation"));
    rpc.beat_errors_.push_back(absl::UnavailableError("coordinator down"));
    rpc.beat_errors_.push_back(absl::NotFoundError("unknown worker"));
  }
  AgentOptions o = Options();
  std::atomic<int> aborts{0};
  o.before_registering_again = [&aborts] { ++aborts; };
  Agent agent(&rpc, o);
  ASSERT_TRUE(agent.Start(absl::Seconds(30)).ok());
  rpc.WaitBeats(6);
  agent.Stop();
  EXPECT_EQ(agent.registrations(), 3);
  EXPECT_EQ(aborts, 2);  // Before each registration but the first.
  EXPECT_EQ(agent.identity().incarnation, 103);
  absl::MutexLock lock(&rpc.mu_);
  EXPECT_EQ(rpc.beats_[0].incarnation(), 101);
  EXPECT_EQ(rpc.beats_[1].incarnation(), 101);  // Refused: ABORTED.
  EXPECT_EQ(rpc.beats_[2].incarnation(), 102);  // UNAVAILABLE: same incarnation next time.
  EXPECT_EQ(rpc.beats_[3].incarnation(), 102);  // Refused: NOT_FOUND.
  EXPECT_EQ(rpc.beats_[4].incarnation(), 103);
}

TEST(AgentTest, StartRetriesTransientErrors) {
  FakeRpc rpc;
  {
    absl::MutexLock lock(&rpc.mu_);
    rpc.register_errors_.push_back(absl::UnavailableError("not up yet"));
    rpc.register_errors_.push_back(absl::DeadlineExceededError("slow"));
  }
  std::vector<std::string> logs;
  AgentOptions o = Options();
  o.log = [&](absl::string_view line) { logs.emplace_back(line); };
  Agent agent(&rpc, o);
  ASSERT_TRUE(agent.Start(absl::Seconds(30)).ok());
  agent.Stop();
  EXPECT_EQ(agent.identity().incarnation, 101);
  EXPECT_GE(logs.size(), 3u);
}

TEST(AgentTest, StartFailsOnBadRequest) {
  FakeRpc rpc;
  {
    absl::MutexLock lock(&rpc.mu_);
    rpc.register_errors_.push_back(absl::InvalidArgumentError("empty address"));
  }
  Agent agent(&rpc, Options());
  EXPECT_EQ(agent.Start(absl::Seconds(30)).code(), absl::StatusCode::kInvalidArgument);
  agent.Stop();  // No thread to join.
}

TEST(AgentTest, StartGivesUpAfterTimeout) {
  FakeRpc rpc;
  {
    absl::MutexLock lock(&rpc.mu_);
    rpc.register_down_ = true;
  }
  Agent agent(&rpc, Options());
  EXPECT_EQ(agent.Start(absl::Milliseconds(20)).code(), absl::StatusCode::kUnavailable);
}

TEST(AgentTest, StopInterruptsALongInterval) {
  FakeRpc rpc;
  {
    absl::MutexLock lock(&rpc.mu_);
    rpc.interval_ms_ = 3600 * 1000;
  }
  Agent agent(&rpc, Options());
  ASSERT_TRUE(agent.Start(absl::Seconds(30)).ok());
  agent.Stop();  // Returns without waiting the hour.
  absl::MutexLock lock(&rpc.mu_);
  EXPECT_TRUE(rpc.beats_.empty());
}

// Every registration reports what the worker holds, and the coordinator's drops reach the
// worker's callback.
TEST(AgentTest, RegistrationReportsHeldBuffersAndAppliesDrops) {
  class DroppingRpc : public FakeRpc {
   public:
    absl::StatusOr<v1::RegisterWorkerResponse> Register(
        const v1::RegisterWorkerRequest& request) override {
      absl::StatusOr<v1::RegisterWorkerResponse> r = FakeRpc::Register(request);
      if (r.ok()) {
        v1::HeldBuffer* d = r->add_drop();
        d->set_tensor("T");
        d->set_version(7);
      }
      return r;
    }
  };
  DroppingRpc rpc;
  AgentOptions o = Options();
  o.held = [] {
    v1::HeldBuffer h;
    h.set_tensor("T");
    h.set_version(7);
    h.mutable_chunks()->set_rank(5);
    return std::vector<v1::HeldBuffer>{h};
  };
  std::vector<std::pair<std::string, int64_t>> dropped;
  o.drop = [&dropped](const std::string& t, int64_t v) { dropped.emplace_back(t, v); };
  Agent agent(&rpc, o);
  ASSERT_TRUE(agent.Start(absl::Seconds(30)).ok());
  agent.Stop();
  ASSERT_EQ(dropped.size(), 1u);
  EXPECT_EQ(dropped[0], std::make_pair(std::string("T"), int64_t{7}));
  absl::MutexLock lock(&rpc.mu_);
  ASSERT_EQ(rpc.last_registration_.held_size(), 1);
  EXPECT_EQ(rpc.last_registration_.held(0).tensor(), "T");
  EXPECT_EQ(rpc.last_registration_.held(0).version(), 7);
}

}  // namespace
}  // namespace shardcoord
