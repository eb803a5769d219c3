#include "coordinator/plans/admission.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/timer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/planner.h"

namespace shardcoord {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int64_t kMiB = int64_t{1} << 20;

class FakeView : public MemoryView {
 public:
  std::map<int64_t, WorkerMemoryView> Workers() const override {
    absl::MutexLock lock(&mu_);
    return workers;
  }
  std::map<int64_t, int64_t> CommittedBytes() const override {
    absl::MutexLock lock(&mu_);
    return committed;
  }
  void Set(int64_t rank, int64_t budget, int64_t used = 0, int64_t bucket = 0) {
    absl::MutexLock lock(&mu_);
    workers[rank] = WorkerMemoryView{rank, "w" + std::to_string(rank), budget, used, bucket};
  }
  void Commit(int64_t rank, int64_t bytes) {
    absl::MutexLock lock(&mu_);
    committed[rank] = bytes;
  }

  mutable absl::Mutex mu_;
  std::map<int64_t, WorkerMemoryView> workers ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int64_t> committed ABSL_GUARDED_BY(mu_);
};

MemoryDemand Demand(std::map<int64_t, int64_t> buffers,
                    std::map<int64_t, std::vector<int64_t>> staging = {},
                    std::map<int64_t, int64_t> frees = {}) {
  MemoryDemand d;
  d.buffers = std::move(buffers);
  for (const auto& [rank, caps] : staging) {
    for (int64_t cap : caps) d.staging[rank].push_back(StagingNeed{cap});
  }
  d.frees = std::move(frees);
  return d;
}

// What the callbacks of one request saw.
struct Outcome {
  std::optional<int64_t> bucket;
  std::optional<absl::Status> refused;
};

class AdmissionTest : public ::testing::Test {
 protected:
  AdmissionTest() : timer_(&clock_) {
    options_.timeout = absl::Seconds(30);
    options_.metrics.wait_seconds =
        registry_.AddHistogram("wait", "w", {"result"}, ExponentialBuckets(0.001, 2, 17));
  }

  AdmissionController& controller() {
    if (!controller_) controller_.emplace(&clock_, &timer_, &view_, options_);
    return *controller_;
  }

  absl::StatusOr<AdmissionController::Grant> Ask(const std::string& what, MemoryDemand d,
                                                 Outcome* out, bool may_wait = true) {
    return controller().Request(
        what, std::move(d), may_wait, [out](int64_t b) { out->bucket = b; },
        [out](const absl::Status& s) { out->refused = s; });
  }

  // Plan p-1 holds 60 of rank `rank`'s 100 MiB (admitted, `first`) and plan p-2 asks for 50
  // more (`second`), which must wait: their grants in `a` and `b`.
  void Contend(int64_t rank, Outcome* first, Outcome* second, AdmissionController::Grant* a,
               AdmissionController::Grant* b) {
    view_.Set(rank, 100 * kMiB);
    absl::StatusOr<AdmissionController::Grant> ga =
        Ask("plan p-1", Demand({{rank, 60 * kMiB}}), first);
    ASSERT_TRUE(ga.ok() && ga->admitted);
    absl::StatusOr<AdmissionController::Grant> gb =
        Ask("plan p-2", Demand({{rank, 50 * kMiB}}), second);
    ASSERT_TRUE(gb.ok()) << gb.status();
    ASSERT_FALSE(gb->admitted);
    *a = *ga;
    *b = *gb;
  }

  FakeClock clock_;
  FakeTimer timer_;
  FakeView view_;
  Registry registry_;
  AdmissionOptions options_;
  std::optional<AdmissionController> controller_;
};

TEST_F(AdmissionTest, AdmitsWithTheSmallestWorkerBucketWhenEverythingFits) {
  view_.Set(0, 1024 * kMiB, 0, 64 * kMiB);
  view_.Set(1, 1024 * kMiB, 0, 32 * kMiB);
  Outcome out;
  auto g = Ask("plan p-1", Demand({{0, 10 * kMiB}, {1, 10 * kMiB}}, {{0, {kMiB * 500}}}), &out);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->admitted);
  EXPECT_EQ(g->bucket_bytes, 32 * kMiB);
  EXPECT_EQ(controller().reserved_bytes(0), 10 * kMiB + StagingLimit(32 * kMiB));
  EXPECT_EQ(controller().reserved_bytes(1), 10 * kMiB);
  controller().Release(g->ticket);
  EXPECT_EQ(controller().reserved_bytes(0), 0);
  EXPECT_FALSE(out.bucket || out.refused);  // Admitted at once: no callback.
}

TEST_F(AdmissionTest, WorkersWithoutABudgetAreUnlimited) {
  view_.Set(0, 0);
  Outcome out;
  auto g = Ask("plan", Demand({{0, int64_t{1} << 50}, {7, 1}}, {{0, {int64_t{1} << 40}}}), &out);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(g->admitted);
  EXPECT_EQ(g->bucket_bytes, kDefaultBucketBytes);
}

TEST_F(AdmissionTest, LowersTheBucketUntilTheStagingFits) {
  view_.Set(0, 100 * kMiB, 0, 64 * kMiB);
  view_.Commit(0, 50 * kMiB);
  // 50 MiB free: 30 MiB of buffers leave 20 MiB for staging of two fragments with large
  // caps: 2 * kBucketsInFlight * b <= 20 MiB -> b = 5 MiB.
  Outcome out;
  auto g = Ask("group g-1", Demand({{0, 30 * kMiB}}, {{0, {kMiB * 400, kMiB * 400}}}), &out);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(g->admitted);
  EXPECT_EQ(g->bucket_bytes, 5 * kMiB);
  EXPECT_EQ(controller().reserved_bytes(0), 50 * kMiB);
  // A small cap stages no more than its cap, leaving room for a larger bucket elsewhere.
  view_.Set(1, 100 * kMiB, 0, 64 * kMiB);
  auto g2 = Ask("plan", Demand({{1, 30 * kMiB}}, {{1, {kMiB, kMiB * 400}}}), &out);
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(g2->bucket_bytes, (70 - 1) * kMiB / kBucketsInFlight);
}

TEST_F(AdmissionTest, EachFragmentStagesItsOwnNumberOfBuckets) {
  view_.Set(0, 100 * kMiB, 0, 64 * kMiB);
  // A fused fragment staging 4 buckets at once next to a plain one staging 2: 40 MiB free
  // for staging -> 6 buckets of 40/6 MiB.
  MemoryDemand d;
  d.buffers[0] = 60 * kMiB;
  d.staging[0] = {StagingNeed{kMiB * 400, 4}, StagingNeed{kMiB * 400, 2}};
  Outcome out;
  auto g = controller().Request("group", d, true, nullptr, nullptr);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->bucket_bytes, 40 * kMiB / 6);
  EXPECT_LE(controller().reserved_bytes(0), 100 * kMiB);
}

TEST_F(AdmissionTest, RefusesAtOnceWhatCannotFitEvenWhenEverythingEnds) {
  view_.Set(2, 64 * kMiB, 0, 64 * kMiB);
  view_.Commit(2, 40 * kMiB);
  Outcome out;
  // 30 MiB of buffers > 24 MiB free of committed data.
  auto g = Ask("group g-3", Demand({{2, 30 * kMiB}}, {{2, {kMiB}}}), &out);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(g.status().message(),
              AllOf(HasSubstr("group g-3: worker w2 (rank 2) needs"),
                    HasSubstr(absl::StrCat(30 * kMiB + StagingLimit(kMinBucketBytes), " bytes")),
                    HasSubstr(absl::StrCat("has ", 24 * kMiB, " bytes (24.0 MiB) free")),
                    HasSubstr("even once every running plan has ended")));
  EXPECT_EQ(controller().waiting(), 0u);
  // Buffers that fit but not with the smallest buckets' staging: refused too.
  auto g2 = Ask("plan", Demand({{2, 24 * kMiB - 1}}, {{2, {kMiB}}}), &out);
  EXPECT_EQ(g2.status().code(), absl::StatusCode::kResourceExhausted);
  // Exactly buffers + the smallest buckets fits.
  auto g3 =
      Ask("plan", Demand({{2, 24 * kMiB - StagingLimit(kMinBucketBytes)}}, {{2, {kMiB}}}), &out);
  ASSERT_TRUE(g3.ok()) << g3.status();
  EXPECT_EQ(g3->bucket_bytes, kMinBucketBytes);
}

TEST_F(AdmissionTest, WaitsForAReleaseThenAdmits) {
  Outcome first, second;
  AdmissionController::Grant a, b;
  ASSERT_NO_FATAL_FAILURE(Contend(0, &first, &second, &a, &b));
  EXPECT_THAT(b.waiting, HasSubstr("worker w0 (rank 0) needs"));
  EXPECT_EQ(controller().waiting(), 1u);
  controller().Recheck();  // Nothing changed: still waiting.
  EXPECT_FALSE(second.bucket);
  clock_.Advance(absl::Seconds(2));
  controller().Release(a.ticket);
  ASSERT_TRUE(second.bucket.has_value());
  EXPECT_EQ(*second.bucket, kDefaultBucketBytes);
  EXPECT_FALSE(second.refused);
  EXPECT_EQ(controller().waiting(), 0u);
  EXPECT_EQ(controller().reserved_bytes(0), 50 * kMiB);
  // The timer is gone: advancing past the timeout refuses nothing.
  timer_.Advance(absl::Minutes(1));
  EXPECT_FALSE(second.refused);
  const std::string text = registry_.Render();
  EXPECT_THAT(text, HasSubstr("wait_count{result=\"waited\"} 1"));
  EXPECT_THAT(text, HasSubstr("wait_count{result=\"admitted\"} 1"));
}

TEST_F(AdmissionTest, TimesOutWithResourceExhaustedNamingTheWorker) {
  Outcome first, second;
  AdmissionController::Grant a, b;
  ASSERT_NO_FATAL_FAILURE(Contend(3, &first, &second, &a, &b));
  timer_.Advance(absl::Seconds(29));
  EXPECT_FALSE(second.refused);
  timer_.Advance(absl::Seconds(1));
  ASSERT_TRUE(second.refused.has_value());
  EXPECT_EQ(second.refused->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      second.refused->message(),
      AllOf(HasSubstr("plan p-2: no memory within the admission timeout (30s)"),
            HasSubstr("worker w3 (rank 3) needs"), HasSubstr(absl::StrCat(50 * kMiB, " bytes")),
            HasSubstr(absl::StrCat("has ", 40 * kMiB, " bytes"))));
  EXPECT_FALSE(second.bucket);
  EXPECT_EQ(controller().waiting(), 0u);
  controller().Release(b.ticket);  // Gone already: ignored.
  controller().Release(a.ticket);
  EXPECT_FALSE(second.bucket);
  EXPECT_THAT(registry_.Render(), HasSubstr("wait_count{result=\"timed_out\"} 1"));
}

TEST_F(AdmissionTest, ZeroTimeoutAndNoWaitRefuseAtOnce) {
  options_.timeout = absl::ZeroDuration();
  view_.Set(0, 100 * kMiB);
  Outcome out;
  auto a = Ask("plan p-1", Demand({{0, 60 * kMiB}}), &out);
  ASSERT_TRUE(a.ok() && a->admitted);
  auto b = Ask("plan p-2", Demand({{0, 50 * kMiB}}), &out);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("plan p-2: worker w0 (rank 0) needs"));
  EXPECT_EQ(controller().waiting(), 0u);
}

TEST_F(AdmissionTest, CreatesNeverWait) {
  view_.Set(0, 100 * kMiB);
  Outcome out;
  auto a = Ask("plan p-1", Demand({{0, 60 * kMiB}}), &out);
  ASSERT_TRUE(a.ok() && a->admitted);
  auto b = Ask("creating 'x'", Demand({{0, 50 * kMiB}}), &out, /*may_wait=*/false);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().message(), HasSubstr("creating 'x': worker w0 (rank 0) needs"));
  auto c = Ask("creating 'y'", Demand({{0, 40 * kMiB}}), &out, /*may_wait=*/false);
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->admitted);
}

TEST_F(AdmissionTest, FirstComeFirstServedPerWorker) {
  view_.Set(0, 100 * kMiB);
  view_.Set(1, 100 * kMiB);
  Outcome held, big, small, other;
  auto h = Ask("held", Demand({{0, 60 * kMiB}}), &held);
  ASSERT_TRUE(h.ok() && h->admitted);
  auto b = Ask("big", Demand({{0, 80 * kMiB}}), &big);
  ASSERT_TRUE(b.ok() && !b->admitted);
  // Would fit now, but a plan waits for worker 0 before it.
  auto s = Ask("small", Demand({{0, 10 * kMiB}}), &small);
  ASSERT_TRUE(s.ok());
  EXPECT_FALSE(s->admitted);
  EXPECT_THAT(s->waiting, HasSubstr("waiting behind"));
  // Another worker is not held up.
  auto o = Ask("other", Demand({{1, 10 * kMiB}}), &other);
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->admitted);
  controller().Release(h->ticket);
  EXPECT_TRUE(big.bucket.has_value());
  EXPECT_TRUE(small.bucket.has_value());  // 80 + 10 fit the 100.
  EXPECT_EQ(controller().waiting(), 0u);
}

TEST_F(AdmissionTest, TheReportedUseIsAFloor) {
  view_.Set(0, 100 * kMiB, /*used=*/90 * kMiB);
  view_.Commit(0, 10 * kMiB);
  Outcome out;
  auto g = Ask("plan", Demand({{0, 20 * kMiB}}), &out);
  ASSERT_TRUE(g.ok());
  EXPECT_FALSE(g->admitted);  // The worker says it holds 90 MiB.
  view_.Set(0, 100 * kMiB, /*used=*/10 * kMiB);
  controller().Recheck();  // A heartbeat.
  EXPECT_TRUE(out.bucket.has_value());
}

TEST_F(AdmissionTest, CreatesCountTheCoordinatorsNumbersNotTheLaggingReport) {
  // The worker's last report still counts a tensor deleted since.
  view_.Set(0, 100 * kMiB, /*used=*/90 * kMiB);
  view_.Commit(0, 10 * kMiB);
  Outcome out;
  auto create = Ask("creating 'x'", Demand({{0, 50 * kMiB}}), &out, /*may_wait=*/false);
  ASSERT_TRUE(create.ok()) << create.status();
  EXPECT_TRUE(create->admitted);
  // A plan waits for a report instead.
  auto plan = Ask("plan", Demand({{0, 20 * kMiB}}), &out);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->admitted);
}

TEST_F(AdmissionTest, WhatAdmittedPlansFreeCountsForTheRefusalAtOnce) {
  view_.Set(0, 100 * kMiB);
  view_.Commit(0, 80 * kMiB);
  Outcome a_out, b_out;
  // A plan that moves 60 MiB of those 80 off this worker when it commits.
  auto a = Ask("plan p-1", Demand({}, {}, {{0, 60 * kMiB}}), &a_out);
  ASSERT_TRUE(a.ok() && a->admitted);
  // 50 MiB do not fit next to 80 committed, but will once p-1 commits: it waits.
  auto b = Ask("plan p-2", Demand({{0, 50 * kMiB}}), &b_out);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_FALSE(b->admitted);
  view_.Commit(0, 20 * kMiB);       // p-1 committed...
  controller().Release(a->ticket);  // ...and ended.
  EXPECT_TRUE(b_out.bucket.has_value());
}

TEST_F(AdmissionTest, AReleasedWaiterGetsNoCallback) {
  view_.Set(0, 100 * kMiB);
  Outcome first, second;
  auto a = Ask("a", Demand({{0, 60 * kMiB}}), &first);
  auto b = Ask("b", Demand({{0, 60 * kMiB}}), &second);
  ASSERT_TRUE(a.ok() && b.ok() && !b->admitted);
  controller().Release(b->ticket);
  EXPECT_EQ(controller().waiting(), 0u);
  controller().Release(a->ticket);
  timer_.Advance(absl::Minutes(1));
  EXPECT_FALSE(second.bucket || second.refused);
}

TEST(PlanMemoryDemandTest, BuffersStagingAndFrees) {
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({4});
  ASSERT_TRUE(mesh.ok());
  absl::StatusOr<Layout> from = Layout::FromPlacements(*mesh, {64, 32}, {Placement::Shard(0)});
  absl::StatusOr<Layout> to = Layout::FromPlacements(*mesh, {64, 32}, {Placement::Replicate()});
  ASSERT_TRUE(from.ok() && to.ok());
  absl::StatusOr<Plan> plan = Redistribute(*from, *to, DType::kF32);
  ASSERT_TRUE(plan.ok());
  const MemoryDemand d = PlanMemoryDemand(*plan, false, &*from);
  for (int64_t r = 0; r < 4; ++r) {
    EXPECT_EQ(d.buffers.at(r), 64 * 32 * 4);  // A whole replica each.
    EXPECT_EQ(d.frees.at(r), 16 * 32 * 4);    // Its shard goes at commit.
    ASSERT_EQ(d.staging.at(r).size(), 1u);
    EXPECT_GT(d.staging.at(r)[0].cap, 0);
    EXPECT_EQ(d.staging.at(r)[0].buckets_in_flight, kBucketsInFlight);
  }
  const MemoryDemand in_place = PlanMemoryDemand(*plan, true, nullptr);
  EXPECT_TRUE(in_place.buffers.empty());
  EXPECT_TRUE(in_place.frees.empty());
  MemoryDemand sum = d;
  sum.Add(d);
  EXPECT_EQ(sum.buffers.at(0), 2 * 64 * 32 * 4);
  EXPECT_EQ(sum.staging.at(0).size(), 2u);
  EXPECT_EQ(sum.Ranks(), (std::set<int64_t>{0, 1, 2, 3}));
}

}  // namespace
}  // namespace shardcoord
