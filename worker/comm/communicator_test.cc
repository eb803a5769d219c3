#include "worker/comm/communicator.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

class FakeCommunicator : public Communicator {
 public:
  explicit FakeCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool broken() const override { return broken_; }
  void Break() { broken_ = true; }
  absl::Status AllGatherV(const void*, int64_t, void*, absl::Span<const int64_t>,
                          const CommOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::Status AllToAllV(const void*, absl::Span<const int64_t>, void*, absl::Span<const int64_t>,
                         const CommOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::Status ReduceScatterV(const void*, void*, absl::Span<const int64_t>, DType, ReduceOp,
                              const CommOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::Status AllReduce(const void*, void*, int64_t, DType, ReduceOp,
                         const CommOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::Status Broadcast(void*, int64_t, int, const CommOptions&) override {
    return absl::UnimplementedError("");
  }
  absl::Status SendRecv(absl::Span<const SendOp> sends, absl::Span<const RecvOp> recvs,
                        const CommOptions& options) override {
    events.push_back("sendrecv");
    for (const SendOp& s : sends) hooks_passed |= static_cast<bool>(s.prepare);
    for (const RecvOp& r : recvs) hooks_passed |= static_cast<bool>(r.done);
    hooks_passed |= static_cast<bool>(options.while_waiting);
    return absl::OkStatus();
  }
  std::vector<std::string> events;
  bool hooks_passed = false;

 private:
  int rank_, size_;
  std::atomic<bool> broken_{false};
};

// Counts builds; a build of a spec whose prefix is "block" waits for `release`.
class FakeFactory : public CommunicatorFactory {
 public:
  absl::StatusOr<std::shared_ptr<Communicator>> Create(const CommunicatorSpec& spec) override {
    builds++;
    if (spec.key_prefix == "fail") return absl::DeadlineExceededError("rendezvous timed out");
    if (spec.key_prefix == "block") {
      started.Notify();
      release.WaitForNotification();
    }
    return std::make_shared<FakeCommunicator>(GroupRankOf(spec),
                                              static_cast<int>(spec.ranks.size()));
  }
  std::atomic<int> builds{0};
  absl::Notification started;
  absl::Notification release;
};

CommunicatorSpec Spec(std::vector<int64_t> ranks, std::string prefix = "p/") {
  CommunicatorSpec s;
  s.ranks = ranks;
  s.incarnations.assign(ranks.size(), 1);
  s.my_rank = ranks[0];
  s.key_prefix = prefix;
  return s;
}

TEST(CommunicatorSpecTest, Validation) {
  EXPECT_TRUE(ValidateCommunicatorSpec(Spec({2, 0, 1})).ok());
  EXPECT_EQ(GroupRankOf(Spec({2, 0, 1})), 0);
  CommunicatorSpec s = Spec({2, 0, 1});
  s.my_rank = 1;
  EXPECT_EQ(GroupRankOf(s), 2);
  s.my_rank = 5;
  EXPECT_NE(ValidateCommunicatorSpec(s).message().find("my_rank 5"), std::string::npos);
  s = Spec({0, 1, 0});
  EXPECT_NE(ValidateCommunicatorSpec(s).message().find("repeat rank 0"), std::string::npos);
  s = Spec({0, 1});
  s.incarnations.pop_back();
  EXPECT_EQ(ValidateCommunicatorSpec(s).code(), absl::StatusCode::kInvalidArgument);
  s = Spec({0, 1});
  s.timeout = absl::ZeroDuration();
  EXPECT_EQ(ValidateCommunicatorSpec(s).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateCommunicatorSpec(CommunicatorSpec()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CommunicatorCacheTest, CachesPerPrefixGroupAndIncarnations) {
  auto factory = std::make_shared<FakeFactory>();
  CommunicatorCache cache(factory);
  auto a = cache.Get(Spec({0, 1}));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->size(), 2);
  EXPECT_EQ(*cache.Get(Spec({0, 1})), *a);
  EXPECT_EQ(factory->builds, 1);

  CommunicatorSpec other_inc = Spec({0, 1});
  other_inc.incarnations[1] = 2;  // Rank 1 restarted.
  EXPECT_NE(*cache.Get(other_inc), *a);
  EXPECT_NE(*cache.Get(Spec({0, 1}, "q/")), *a);
  EXPECT_NE(*cache.Get(Spec({1, 0})), *a);  // Different group order.
  EXPECT_EQ(factory->builds, 4);
  EXPECT_EQ(cache.size(), 4);
}

TEST(CommunicatorCacheTest, BrokenIsRebuilt) {
  auto factory = std::make_shared<FakeFactory>();
  CommunicatorCache cache(factory);
  auto a = *cache.Get(Spec({0, 1}));
  static_cast<FakeCommunicator*>(a.get())->Break();
  auto b = *cache.Get(Spec({0, 1}));
  EXPECT_NE(a, b);
  EXPECT_FALSE(b->broken());
  EXPECT_EQ(factory->builds, 2);
}

TEST(CommunicatorCacheTest, FailedBuildIsNotCached) {
  auto factory = std::make_shared<FakeFactory>();
  CommunicatorCache cache(factory);
  EXPECT_EQ(cache.Get(Spec({0, 1}, "fail")).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cache.size(), 0);
  EXPECT_EQ(cache.Get(Spec({0, 1}, "fail")).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(factory->builds, 2);
  CommunicatorSpec bad = Spec({0, 5});
  bad.my_rank = 7;
  EXPECT_EQ(cache.Get(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(factory->builds, 2);
}

TEST(CommunicatorCacheTest, ReleasePrefix) {
  auto factory = std::make_shared<FakeFactory>();
  CommunicatorCache cache(factory);
  auto a = *cache.Get(Spec({0, 1}, "plan1/"));
  cache.Get(Spec({0, 2}, "plan1/")).IgnoreError();
  cache.Get(Spec({0, 1}, "plan2/")).IgnoreError();
  EXPECT_EQ(cache.ReleasePrefix("plan1/"), 2);
  EXPECT_EQ(cache.size(), 1);
  EXPECT_EQ(a->size(), 2);  // Still usable by its holder.
  EXPECT_EQ(cache.ReleasePrefix("plan1/"), 0);
}

TEST(CommunicatorCacheTest, CountsBuildsAndAborts) {
  auto factory = std::make_shared<FakeFactory>();
  Registry registry;
  CommunicatorCacheMetrics metrics;
  metrics.builds = registry.AddCounter("builds_total", "B.", {"result"});
  metrics.aborts = registry.AddCounter("aborts_total", "A.", {"reason"});
  CommunicatorCache cache(factory, metrics);
  auto a = *cache.Get(Spec({0, 1}, "e0/"));
  cache.Get(Spec({0, 2}, "e0/")).IgnoreError();
  cache.Get(Spec({0, 1}, "fail")).IgnoreError();
  static_cast<FakeCommunicator*>(a.get())->Break();
  cache.Get(Spec({0, 1}, "e0/")).IgnoreError();  // Rebuilt.
  EXPECT_EQ(cache.ReleasePrefix("e0/"), 2);
  EXPECT_EQ(registry.Render(),
            "# HELP builds_total B.\n"
            "# TYPE builds_total counter\n"
            "builds_total{result=\"error\"} 1\n"
            "builds_total{result=\"ok\"} 3\n"
            "# HELP aborts_total A.\n"
            "# TYPE aborts_total counter\n"
            "aborts_total{reason=\"broken\"} 1\n"
            "aborts_total{reason=\"plan_aborted\"} 2\n");
}

TEST(CommunicatorCacheTest, ConcurrentGetsShareOneBuildAndOtherKeysProceed) {
  auto factory = std::make_shared<FakeFactory>();
  CommunicatorCache cache(factory);
  std::vector<std::shared_ptr<Communicator>> got(3);
  std::thread first([&] { got[0] = *cache.Get(Spec({0, 1}, "block")); });
  factory->started.WaitForNotification();
  std::thread second([&] { got[1] = *cache.Get(Spec({0, 1}, "block")); });
  // A different key builds while "block" is still in its rendezvous.
  got[2] = *cache.Get(Spec({0, 3}, "block2"));
  EXPECT_NE(got[2], nullptr);
  factory->release.Notify();
  first.join();
  second.join();
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(factory->builds, 2);
}

TEST(CommunicatorHooksTest, RunAroundBackendsThatIgnoreThem) {
  FakeCommunicator comm(0, 2);
  EXPECT_FALSE(comm.RunsHooks());
  char a = 0, b = 0;
  std::vector<SendOp> sends = {{1, &a, 1, [&] {
                                  comm.events.push_back("prepare");
                                  return absl::OkStatus();
                                }}};
  std::vector<RecvOp> recvs = {{1, &b, 1, [&] {
                                  comm.events.push_back("done");
                                  return absl::OkStatus();
                                }}};
  CommOptions options;
  options.while_waiting = [&] {
    comm.events.push_back("local");
    return absl::OkStatus();
  };
  ASSERT_TRUE(SendRecvWithHooks(comm, sends, recvs, options).ok());
  EXPECT_EQ(comm.events, (std::vector<std::string>{"prepare", "local", "sendrecv", "done"}));
  EXPECT_FALSE(comm.hooks_passed);

  comm.events.clear();
  ASSERT_TRUE(PrepareOptions(comm, &options).ok());
  EXPECT_EQ(comm.events, (std::vector<std::string>{"local"}));
  EXPECT_FALSE(static_cast<bool>(options.while_waiting));

  sends[0].prepare = [] { return absl::DataLossError("pack failed"); };
  EXPECT_EQ(SendRecvWithHooks(comm, sends, recvs, {}).code(), absl::StatusCode::kDataLoss);
}

TEST(CancelTokenTest, CallbacksRunOnceAndRemoveStopsThem) {
  CancelToken token;
  int a = 0, b = 0;
  const int64_t ha = token.OnCancel([&] { ++a; });
  const int64_t hb = token.OnCancel([&] { ++b; });
  token.Remove(hb);
  EXPECT_FALSE(token.cancelled());
  token.Cancel();
  token.Cancel();
  EXPECT_TRUE(token.cancelled());
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
  token.Remove(ha);  // Harmless after the fact.
  int c = 0;
  EXPECT_EQ(token.OnCancel([&] { ++c; }), -1);  // Already cancelled: runs at once.
  EXPECT_EQ(c, 1);
}

TEST(CommunicatorCacheTest, ReleaseDuringBuildDropsItAfterwards) {
  auto factory = std::make_shared<FakeFactory>();
  CommunicatorCache cache(factory);
  std::shared_ptr<Communicator> got;
  std::thread t([&] { got = *cache.Get(Spec({0, 1}, "block")); });
  factory->started.WaitForNotification();
  EXPECT_EQ(cache.ReleasePrefix("block"), 0);
  factory->release.Notify();
  t.join();
  EXPECT_NE(got, nullptr);
  EXPECT_EQ(cache.size(), 0);
}

}  // namespace
}  // namespace shardcoord
