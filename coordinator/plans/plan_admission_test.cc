// Memory admission wired into the plan manager and tensor I/O, as the coordinator wires it:
// workers registered with budgets, tensors created through TensorIo (the fake workers fill
// them), plans whose fragments go out only once admitted, with the bucket size admission
// chose.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/timer.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/io/tensor_io.h"
#include "coordinator/plans/admission.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/testing/cluster_fixture.h"
#include "coordinator/testing/fake_reports.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Four workers with `budget` bytes each and 2048-byte buckets; f32 [16, 16] tensors (1 KiB)
// sharded S(0) on a 4-rank mesh hold 256 bytes per rank; gathering one to R takes a new
// 1 KiB buffer on every rank and stages at most 3 KiB.
class PlanAdmissionTest : public ClusterFixture {
 protected:
  explicit PlanAdmissionTest(int64_t budget = 3000)
      : view_(&workers_, &tensors_),
        admission_(&clock_, &timer_, &view_, AdmissionOptionsForTest()),
        plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, Options()),
        io_(&workers_, &meshes_, &tensors_, &client_) {
    view_.set_controller(&admission_);
    workers_.AddListener(&plans_);
    workers_.AddListener(&view_);
    io_.set_admission(&admission_);
    RegisterWorkers(4, [budget](WorkerSpec& spec) {
      spec.memory.budget_bytes = budget;
      spec.bucket_bytes = 2048;
    });
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
  }

  static AdmissionOptions AdmissionOptionsForTest() {
    AdmissionOptions o;
    o.timeout = absl::Seconds(30);
    o.min_bucket_bytes = 64;
    return o;
  }

  PlanManagerOptions Options() {
    PlanManagerOptions o;
    o.plan_timeout = absl::Minutes(1);
    o.admission = &admission_;
    return o;
  }

  static Spec MakeSpec(const std::string& placements) { return TestSpec(placements, "N"); }

  absl::Status Create(const std::string& name, Shape shape = {16, 16},
                      const std::string& placements = "S(0)") {
    CreateTensorArgs args;
    args.name = name;
    args.shape = std::move(shape);
    args.dtype = DType::kF32;
    args.spec = MakeSpec(placements);
    args.init = v1::ARANGE;
    std::optional<absl::StatusOr<TensorRecord>> out;
    io_.Create(args, [&](absl::StatusOr<TensorRecord> r) { out = std::move(r); });
    EXPECT_TRUE(out.has_value());
    return out->status();
  }

  // Every rank reports its planned target chunks (checksums equal per box, so replicas agree).
  void ReportAll(const std::string& plan_id) {
    ClusterFixture::ReportAll(&plans_, plan_id, [](const Chunk& c) { return c.box.offset(0) + 1; });
  }

  ClusterMemoryView view_;
  AdmissionController admission_;
  PlanManager plans_;
  TensorIo io_;
};

TEST_F(PlanAdmissionTest, APlanGetsTheBucketThatFitsAfterItsBuffers) {
  ASSERT_TRUE(Create("a").ok());
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> p = plans_.Redistribute("a", MakeSpec("R"), Record(&done));
  ASSERT_TRUE(p.ok()) << p.status();
  // 3000 - 256 committed - 1024 new leaves 1720 for 2 buckets (the cap, 3 KiB, is larger).
  EXPECT_EQ(p->progress.bucket_bytes, 860);
  const std::map<int64_t, v1::PlanFragment> fragments = Fragments(p->id);
  ASSERT_EQ(fragments.size(), 4u);
  for (const auto& [rank, f] : fragments) EXPECT_EQ(f.bucket_bytes(), 860) << rank;
  ReportAll(p->id);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
  EXPECT_EQ(admission_.reserved_bytes(0), 0);  // Released at the end.
}

TEST_F(PlanAdmissionTest, AGroupThatCannotFitIsRefusedAndChangesNothing) {
  for (const char* t : {"a", "b", "c"}) ASSERT_TRUE(Create(t).ok());
  std::vector<RedistributeMember> members;
  for (const char* t : {"a", "b", "c"}) members.push_back(RedistributeMember{t, MakeSpec("R")});
  // Three 1 KiB replicas next to 768 committed bytes do not fit 3000 bytes.
  absl::StatusOr<StartedGroup> g = plans_.RedistributeGroup(members, nullptr);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(g.status().message(),
              AllOf(HasSubstr("group g-1: worker w0 (rank 0) needs"), HasSubstr("new buffers 3072"),
                    HasSubstr("2232 bytes"), HasSubstr("free of its 3000-byte budget")));
  EXPECT_TRUE(client_.fragments().empty());
  EXPECT_EQ(plans_.RunningPlansCount(), 0u);
  // Nothing is held: the tensors take a plan at once.
  absl::StatusOr<StartedPlan> again = plans_.Redistribute("a", MakeSpec("R"), nullptr);
  ASSERT_TRUE(again.ok()) << again.status();
}

TEST_F(PlanAdmissionTest, AGroupIsAdmittedAsOneWithOneBucket) {
  ASSERT_TRUE(Create("a").ok());
  ASSERT_TRUE(Create("b").ok());
  std::vector<RedistributeMember> members = {{"a", MakeSpec("R")}, {"b", MakeSpec("R")}};
  absl::StatusOr<StartedGroup> g = plans_.RedistributeGroup(members, nullptr);
  ASSERT_TRUE(g.ok()) << g.status();
  // 3000 - 512 - 2048 = 440 for the fused fragment's staging (a stream of 512 bytes to each
  // peer and one from each): kBucketsInFlight buckets of 220, the same on every worker.
  EXPECT_EQ(g->bucket_bytes, 220);
  for (const StartedPlan& m : g->members) EXPECT_EQ(m.progress.bucket_bytes, 220);
  const std::map<int64_t, v1::PlanFragment> sent = Fragments(g->id);
  ASSERT_EQ(sent.size(), 4u);
  for (const auto& [rank, f] : sent) EXPECT_EQ(f.bucket_bytes(), 220) << rank;
}

TEST_F(PlanAdmissionTest, APlanWaitsForAnotherToReleaseMemoryThenRuns) {
  ASSERT_TRUE(Create("a").ok());
  ASSERT_TRUE(Create("b").ok());
  std::optional<PlanOutcome> first, second;
  absl::StatusOr<StartedPlan> p1 = plans_.Redistribute("a", MakeSpec("R"), Record(&first));
  ASSERT_TRUE(p1.ok()) << p1.status();
  absl::StatusOr<StartedPlan> p2 = plans_.Redistribute("b", MakeSpec("R"), Record(&second));
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_EQ(p2->progress.state, PlanState::kPending);
  EXPECT_EQ(p2->progress.bucket_bytes, 0);
  EXPECT_THAT(p2->progress.waiting_for_memory, HasSubstr("needs"));
  EXPECT_TRUE(Fragments(p2->id).empty());  // Held back.
  EXPECT_EQ(admission_.waiting(), 1u);
  // "b" is busy meanwhile, as under any plan.
  EXPECT_EQ(plans_.Redistribute("b", MakeSpec("S(1)"), nullptr).status().code(),
            absl::StatusCode::kAborted);

  ReportAll(p1->id);  // p1 commits: its buffers are committed now, its staging is free.
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->status.ok()) << first->status;
  EXPECT_EQ(admission_.waiting(), 0u);
  const std::map<int64_t, v1::PlanFragment> sent = Fragments(p2->id);
  ASSERT_EQ(sent.size(), 4u);
  // 3000 - (1024 + 256) committed - 1024 new = 696: buckets of 348.
  for (const auto& [rank, f] : sent) EXPECT_EQ(f.bucket_bytes(), 348);
  absl::StatusOr<PlanProgress> progress = plans_.Progress(p2->id);
  ASSERT_TRUE(progress.ok());
  EXPECT_EQ(progress->bucket_bytes, 348);
  EXPECT_TRUE(progress->waiting_for_memory.empty());
  ReportAll(p2->id);
  ASSERT_TRUE(second.has_value());
  EXPECT_TRUE(second->status.ok()) << second->status;
}

TEST_F(PlanAdmissionTest, AWaitingPlanIsSentOnlyOnceTheWorkersDroppedWhatACommitReplaced) {
  ASSERT_TRUE(Create("a").ok());
  ASSERT_TRUE(Create("b").ok());
  std::optional<PlanOutcome> first;
  absl::StatusOr<StartedPlan> p1 = plans_.Redistribute("a", MakeSpec("R"), Record(&first));
  ASSERT_TRUE(p1.ok()) << p1.status();
  absl::StatusOr<StartedPlan> p2 = plans_.Redistribute("b", MakeSpec("R"), nullptr);
  ASSERT_TRUE(p2.ok()) << p2.status();
  client_.HoldFinishes(true);
  ReportAll(p1->id);
  ASSERT_TRUE(first.has_value());
  EXPECT_TRUE(first->status.ok()) << first->status;  // The caller is answered at the commit,
  EXPECT_EQ(admission_.waiting(), 1u);               // but p2 waits until every worker
  EXPECT_TRUE(Fragments(p2->id).empty());            // has dropped a's old version.
  client_.ReleaseFinishes();
  EXPECT_EQ(admission_.waiting(), 0u);
  EXPECT_EQ(Fragments(p2->id).size(), 4u);
}

// A fused group's commit sends one FinishPlan per worker; until every one is answered the
// group's ticket holds its memory, as a plan's does.
TEST_F(PlanAdmissionTest, APlanWaitingBehindAGroupIsSentOnlyOnceTheWorkersDroppedItsOldVersions) {
  ASSERT_TRUE(Create("a").ok());
  ASSERT_TRUE(Create("b").ok());
  std::optional<absl::Status> group_done;
  absl::StatusOr<StartedGroup> g = plans_.RedistributeGroup(
      {{"a", MakeSpec("R")}}, [&](const absl::Status& s, const GroupProgress&) { group_done = s; });
  ASSERT_TRUE(g.ok()) << g.status();
  absl::StatusOr<StartedPlan> p2 = plans_.Redistribute("b", MakeSpec("R"), nullptr);
  ASSERT_TRUE(p2.ok()) << p2.status();
  EXPECT_EQ(admission_.waiting(), 1u);
  client_.HoldFinishes(true);
  for (const auto& [rank, f] : Fragments(g->id)) {
    ASSERT_TRUE(
        plans_.Report(FakeFusedFinalReport(f, absl::StrCat("w", rank), Incarnation(rank))).ok())
        << rank;
  }
  ASSERT_TRUE(group_done.has_value());
  EXPECT_TRUE(group_done->ok()) << *group_done;  // Answered at the commit,
  EXPECT_EQ(admission_.waiting(), 1u);           // but p2 waits for the workers' drops.
  EXPECT_TRUE(Fragments(p2->id).empty());
  client_.ReleaseFinishes();
  EXPECT_EQ(admission_.waiting(), 0u);
  EXPECT_EQ(Fragments(p2->id).size(), 4u);
}

TEST_F(PlanAdmissionTest, AWaitingPlanFailsWithResourceExhaustedAtTheTimeout) {
  ASSERT_TRUE(Create("a").ok());
  ASSERT_TRUE(Create("b").ok());
  std::optional<PlanOutcome> second;
  absl::StatusOr<StartedPlan> p1 = plans_.Redistribute("a", MakeSpec("R"), nullptr);
  ASSERT_TRUE(p1.ok()) << p1.status();
  absl::StatusOr<StartedPlan> p2 = plans_.Redistribute("b", MakeSpec("R"), Record(&second));
  ASSERT_TRUE(p2.ok()) << p2.status();
  timer_.Advance(absl::Seconds(30));
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second->status.message(),
              AllOf(HasSubstr("no memory within the admission timeout (30s)"),
                    HasSubstr("worker w0 (rank 0) needs"), HasSubstr(") free of its")));
  EXPECT_EQ(second->progress.state, PlanState::kAborted);
  EXPECT_TRUE(Fragments(p2->id).empty());
  // "b" keeps its version and takes a plan again.
  EXPECT_TRUE(plans_.Redistribute("b", MakeSpec("S(1)"), nullptr).ok());
}

TEST_F(PlanAdmissionTest, AHeartbeatThatReportsLessUseAdmitsAWaitingPlan) {
  ASSERT_TRUE(Create("a").ok());
  // Worker 2 says it holds 2500 bytes (more than the coordinator knows of).
  WorkerMemory busy{3000, 2500, 2500};
  ASSERT_TRUE(workers_.Heartbeat("w2", Incarnation(2), &busy).ok());
  absl::StatusOr<StartedPlan> p = plans_.Redistribute("a", MakeSpec("R"), nullptr);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->progress.waiting_for_memory, HasSubstr("worker w2 (rank 2)"));
  EXPECT_TRUE(Fragments(p->id).empty());
  WorkerMemory idle{3000, 256, 2500};
  ASSERT_TRUE(workers_.Heartbeat("w2", Incarnation(2), &idle).ok());
  EXPECT_EQ(Fragments(p->id).size(), 4u);
}

TEST_F(PlanAdmissionTest, CreatesAndUploadsThatDoNotFitAreRefusedAtOnce) {
  // 4 KiB per rank does not fit a 3000-byte budget.
  absl::Status s = Create("big", {256, 16});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), AllOf(HasSubstr("creating 'big': worker w0 (rank 0) needs 4096 bytes"),
                                 HasSubstr("3000 bytes")));
  EXPECT_EQ(client_.calls("Fill"), 0);
  EXPECT_EQ(tensors_.Get("big").status().code(), absl::StatusCode::kNotFound);
  UploadArgs up;
  up.name = "big";
  up.shape = {256, 16};
  up.dtype = DType::kF32;
  up.spec = MakeSpec("S(0)");
  absl::StatusOr<std::shared_ptr<TensorIo::UploadStream>> stream = io_.StartUpload(up);
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(stream.status().message(), HasSubstr("uploading 'big': worker w0 (rank 0) needs"));
  EXPECT_EQ(tensors_.Get("big").status().code(), absl::StatusCode::kNotFound);
  // What fits is created, and its memory counts as committed from then on.
  ASSERT_TRUE(Create("small").ok());
  EXPECT_EQ(admission_.reserved_bytes(0), 0);
  EXPECT_EQ(view_.CommittedBytes().at(0), 256);
}

}  // namespace
}  // namespace shardcoord
