#include "coordinator/cluster/worker_drain.h"

#include <optional>

#include "absl/strings/str_cat.h"
#include "coordinator/testing/cluster_fixture.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Four workers w0..w3 (ranks 0..3) and a 2x2 mesh; plans run against the fake client, and
// the test plays the workers' reports.
class WorkerDrainTest : public ClusterFixture {
 protected:
  WorkerDrainTest()
      : plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_),
        drain_(&clock_, &timer_, &workers_, &tensors_, &plans_) {
    workers_.AddListener(&plans_);
    for (int i = 0; i < 4; ++i) Register(i);
    EXPECT_TRUE(meshes_.Create("M", {2, 2}, {"dp", "tp"}, {}).ok());
  }

  void Register(int rank) {
    const std::string name = absl::StrCat("w", rank);
    EXPECT_TRUE(workers_.Register(WorkerSpec{name, "h", "cpu", name + ":1", "gloo"}).ok());
  }
  WorkerRecord Worker(int64_t rank) { return *workers_.GetByRank(rank); }

  // S(0),R on M: [0:4) on ranks 0 and 1, [4:8) on ranks 2 and 3.
  void CreateTensor(const std::string& name) {
    CreateTestTensor(workers_, meshes_, &tensors_, name, "S(0),R", "M", {8, 4});
  }

  // Every participant of `plan_id` reports its target chunks (checksums as created).
  void ReportAll(const std::string& plan_id) {
    ClusterFixture::ReportAll(&plans_, plan_id,
                              [](const Chunk& c) { return 1000 + c.box.offset(0); });
  }

  WorkerDrain::Done Record() {
    return [this](absl::StatusOr<LeaveOutcome> out) { outcome_ = std::move(out); };
  }

  Spec Target(const std::string& placements) { return TestSpec(placements); }

  PlanManager plans_;
  WorkerDrain drain_;
  std::optional<absl::StatusOr<LeaveOutcome>> outcome_;
};

TEST_F(WorkerDrainTest, AnIdleWorkerLeavesAtOnceAndOnlyWhatItAloneHeldIsLost) {
  CreateTensor("t");
  // Rank 2's replica of [4:8) is gone: rank 3 holds it alone.
  ASSERT_TRUE(workers_.MarkDead("w2", Worker(2).incarnation, "test").ok());
  drain_.Leave("w3", Worker(3).incarnation, absl::Seconds(30), Record());
  ASSERT_TRUE(outcome_.has_value());
  ASSERT_TRUE(outcome_->ok()) << outcome_->status();
  EXPECT_THAT((*outcome_)->aborted_plans, IsEmpty());
  EXPECT_THAT((*outcome_)->repaired_tensors, IsEmpty());
  EXPECT_THAT((*outcome_)->lost, ElementsAre(HasSubstr("t: [4:8, 0:4]")));
  EXPECT_FALSE(Worker(3).alive);
  EXPECT_THAT(Worker(3).death_reason, HasSubstr("left the cluster"));
  // Rank 0 leaving loses nothing: rank 1 holds [0:4) too.
  outcome_.reset();
  drain_.Leave("w0", Worker(0).incarnation, absl::Seconds(30), Record());
  ASSERT_TRUE(outcome_.has_value() && outcome_->ok());
  EXPECT_THAT((*outcome_)->lost, IsEmpty());
}

TEST_F(WorkerDrainTest, RunningPlansFinishFirstAndNewPlansOnTheWorkerAreRefused) {
  CreateTensor("t");
  CreateTensor("u");
  absl::StatusOr<StartedPlan> p = plans_.Redistribute("t", Target("R,S(0)"), nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  drain_.Leave("w1", Worker(1).incarnation, absl::Seconds(30), Record());
  EXPECT_FALSE(outcome_.has_value());  // Waits for p.
  EXPECT_TRUE(Worker(1).leaving);
  absl::StatusOr<StartedPlan> refused = plans_.Redistribute("u", Target("R,S(0)"), nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("worker w1 (rank 1) is leaving"));
  ReportAll(p->id);
  ASSERT_TRUE(outcome_.has_value());
  ASSERT_TRUE(outcome_->ok()) << outcome_->status();
  EXPECT_THAT((*outcome_)->aborted_plans, IsEmpty());
  EXPECT_EQ(plans_.Progress(p->id)->state, PlanState::kCommitted);
  EXPECT_FALSE(Worker(1).alive);
  // A second leave of the same incarnation is stale.
  outcome_.reset();
  drain_.Leave("w1", Worker(1).incarnation, absl::Seconds(30), Record());
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_EQ(outcome_->status().code(), absl::StatusCode::kAborted) << outcome_->status();
}

TEST_F(WorkerDrainTest, PlansStillRunningAtTheDrainTimeoutAreAborted) {
  CreateTensor("t");
  absl::StatusOr<StartedPlan> p = plans_.Redistribute("t", Target("R,S(0)"), nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  drain_.Leave("w2", Worker(2).incarnation, absl::Seconds(3), Record());
  timer_.Advance(absl::Seconds(2));
  EXPECT_FALSE(outcome_.has_value());
  timer_.Advance(absl::Seconds(2));
  ASSERT_TRUE(outcome_.has_value());
  ASSERT_TRUE(outcome_->ok()) << outcome_->status();
  EXPECT_THAT((*outcome_)->aborted_plans, ElementsAre(p->id));
  absl::StatusOr<PlanProgress> progress = plans_.Progress(p->id);
  EXPECT_EQ(progress->state, PlanState::kAborted);
  EXPECT_THAT(progress->error, HasSubstr("drain timeout"));
  EXPECT_EQ(tensors_.Get("t")->spec, "S(0),R");  // The old layout stays.
}

TEST_F(WorkerDrainTest, TheLastCopyOfAChunkIsCopiedToAReplicaThatRegisteredAgain) {
  CreateTensor("t");
  // w1 restarts: alive again under its rank, but its copy of [0:4) is gone.
  Register(1);
  ASSERT_TRUE(NeedsRepairBeforeLeave(
      *tensors_.Get("t"), 0, [this](int64_t r, int64_t inc) { return workers_.IsLive(r, inc); },
      [](int64_t) { return true; }));
  drain_.Leave("w0", Worker(0).incarnation, absl::Seconds(30), Record());
  EXPECT_FALSE(outcome_.has_value());  // The repair runs.
  std::string repair;
  for (const v1::PlanFragment& f : client_.fragments()) repair = f.plan_id();
  ASSERT_FALSE(repair.empty());
  ReportAll(repair);
  ASSERT_TRUE(outcome_.has_value());
  ASSERT_TRUE(outcome_->ok()) << outcome_->status();
  EXPECT_THAT((*outcome_)->repaired_tensors, ElementsAre("t"));
  EXPECT_THAT((*outcome_)->lost, IsEmpty());
  // The tensor keeps its layout and is whole without w0.
  absl::StatusOr<TensorRecord> t = tensors_.Get("t");
  EXPECT_EQ(t->spec, "S(0),R");
  EXPECT_THAT(LostChunks(*t, [this](int64_t r, int64_t inc) { return workers_.IsLive(r, inc); }),
              IsEmpty());
}

}  // namespace
}  // namespace shardcoord
