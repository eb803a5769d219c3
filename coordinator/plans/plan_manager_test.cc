#include "coordinator/plans/plan_manager.h"

#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "coordinator/testing/cluster_fixture.h"
#include "coordinator/testing/fake_reports.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/box_copy.h"
#include "sharding/fused_stream.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class PlanManagerTest : public ClusterFixture {
 protected:
  PlanManagerTest()
      : plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, Options()) {
    workers_.AddListener(&plans_);
    RegisterWorkers(4);
    EXPECT_TRUE(meshes_.Create("M", {2, 2}, {"dp", "tp"}, {}).ok());
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
  }

  PlanManagerOptions Options() {
    PlanManagerOptions o;
    o.plan_timeout = absl::Minutes(1);
    o.failure_grace = absl::Seconds(2);
    o.on_plan_end = [this](const PlanProgress&, const std::string& prefix) {
      ended_prefixes_.push_back(prefix);
    };
    o.metrics = &metrics_;
    return o;
  }

  // A ready tensor, S(0),R on M ([0:4) on ranks 0,1 and [4:8) on ranks 2,3), version 1.
  void CreateTensor(const std::string& name, const std::string& placements = "S(0),R",
                    const std::string& mesh = "M", Shape shape = {8, 4},
                    DType dtype = DType::kF32) {
    CreateTestTensor(workers_, meshes_, &tensors_, name, placements, mesh, std::move(shape), dtype);
  }

  Spec Target(const std::string& placements, const std::string& mesh = "") {
    return TestSpec(placements, mesh);
  }

  // How many FinishPlans were sent, each expected to commit (or abort) and drop
  // `drop_version`.
  int CountFinishes(bool commit, int64_t drop_version) {
    int n = 0;
    for (const auto& [rank, req] : client_.finishes()) {
      EXPECT_EQ(req.commit(), commit) << "rank " << rank;
      EXPECT_EQ(req.drop_version(), drop_version) << "rank " << rank;
      ++n;
    }
    return n;
  }

  void ReportAll(const std::string& plan_id, std::set<int64_t> skip = {}) {
    ClusterFixture::ReportAll(&plans_, plan_id, DefaultFakeChecksum, skip);
  }

  // What a worker that ran its fused group fragment correctly reports (fake_reports.h).
  WorkerReport FusedFinalReport(const v1::PlanFragment& f) {
    return FakeFusedFinalReport(f, workers_.GetByRank(f.rank())->spec.name, Incarnation(f.rank()));
  }

  void ReportAllFused(const std::string& group_id, std::set<int64_t> skip = {}) {
    for (const auto& [rank, f] : Fragments(group_id)) {
      if (skip.count(rank)) continue;
      ASSERT_TRUE(plans_.Report(FusedFinalReport(f)).ok()) << rank;
    }
  }

  std::vector<std::string> ended_prefixes_;
  Registry registry_;
  CoordinatorMetrics metrics_{&registry_};
  PlanManager plans_;
};

TEST_F(PlanManagerTest, EndedPlansAreCountedByOpAndState) {
  CreateTensor("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> committed = plans_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(committed.ok()) << committed.status();
  ReportAll(committed->id);
  ASSERT_TRUE(done.has_value() && done->status.ok());

  absl::StatusOr<StartedPlan> aborted = plans_.Gather("T", "", 0, Record(&done));
  ASSERT_TRUE(aborted.ok()) << aborted.status();
  plans_.Abort(aborted->id, "test");
  timer_.Advance(absl::Seconds(2));

  EXPECT_EQ(metrics_.plans->WithLabels({"redistribute", "committed"})->Value(), 1);
  EXPECT_EQ(metrics_.plans->WithLabels({"gather", "aborted"})->Value(), 1);
  EXPECT_EQ(metrics_.plans->WithLabels({"redistribute", "aborted"})->Value(), 0);
  // Only committed plans add to the bytes counters.
  EXPECT_EQ(metrics_.bytes_moved->Value(), committed->plan->bytes_moved);
  EXPECT_EQ(metrics_.lower_bound_bytes->Value(), committed->plan->lower_bound_bytes);
  EXPECT_EQ(metrics_.plan_bytes->WithLabels({"redistribute"})->Read().sum,
            committed->plan->bytes_moved);
  EXPECT_EQ(metrics_.plan_duration_seconds->WithLabels({"gather"})->Read().count, 1u);
}

TEST_F(PlanManagerTest, CommitReplacesTheLayoutAndDropsTheOldVersion) {
  CreateTensor("T");
  const TensorRecord before = *tensors_.Get("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  const std::string id = started->id;
  EXPECT_EQ(started->progress.state, PlanState::kPending);
  EXPECT_EQ(started->progress.bytes_total, started->plan->bytes_moved);
  EXPECT_GT(started->plan->bytes_moved, 0);
  EXPECT_EQ(tensors_.Get("T")->busy_plan, id);

  std::vector<PlanProgress> seen;
  ASSERT_TRUE(plans_.Watch(id, [&](const PlanProgress& p) { seen.push_back(p); }).ok());
  // The fake accepted every fragment inline.
  EXPECT_EQ(plans_.Progress(id)->state, PlanState::kPrepared);

  std::map<int64_t, v1::PlanFragment> fragments = Fragments(id);
  ASSERT_EQ(fragments.size(), 4u);
  const int64_t target_version = fragments[0].target_version();
  EXPECT_EQ(fragments[0].source_version(), before.version);
  EXPECT_GT(target_version, before.version);
  EXPECT_EQ(fragments[3].member_incarnations_size(), fragments[3].member_ranks_size());
  // Communicators are per epoch, shared by plans until an abort.
  EXPECT_EQ(fragments[1].communicator_prefix(), "shardcoord/comm/0/");

  // Progress reports move bytes_done; then the final reports commit.
  WorkerReport progress;
  progress.plan_id = id;
  progress.rank = 1;
  progress.worker = "w1";
  progress.incarnation = Incarnation(1);
  progress.bytes_done = 16;
  ASSERT_TRUE(plans_.Report(progress).ok());
  EXPECT_EQ(plans_.Progress(id)->bytes_done, 16);
  ReportAll(id);

  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
  EXPECT_EQ(done->progress.state, PlanState::kCommitted);
  EXPECT_EQ(done->progress.bytes_done, done->progress.bytes_total);

  const TensorRecord after = *tensors_.Get("T");
  EXPECT_EQ(after.version, target_version);
  EXPECT_EQ(after.spec, "R,S(1)");
  EXPECT_EQ(after.layout, started->plan->target);
  EXPECT_TRUE(after.busy_plan.empty());
  // Rank 2 holds columns [2:4) after R,S(1): the checksum it reported is the one kept.
  EXPECT_EQ(after.checksums[1][0], static_cast<uint64_t>(0 * 131 + 2));

  // Every participant was told to commit and drop the source version.
  EXPECT_EQ(CountFinishes(/*commit=*/true, before.version), 4);

  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().state, PlanState::kCommitted);
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i].seq, seen[i - 1].seq);
  // A commit retires nothing: the communicators serve the next plans.
  EXPECT_THAT(ended_prefixes_, ElementsAre(""));

  // Late reports are rejected; a new plan can run.
  EXPECT_EQ(plans_.Report(FinalReport(fragments[0])).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(plans_.Redistribute("T", Target("S(0),R"), nullptr).ok());
}

// A single plan is a transaction of one member under the plan's id: its workers report under
// that id, its trace shows their timings, and it is no group's.
TEST_F(PlanManagerTest, ASinglePlanIsATransactionOfItsOwn) {
  CreateTensor("T");
  absl::StatusOr<StartedPlan> started = plans_.Redistribute("T", Target("R,S(1)"), nullptr);
  ASSERT_TRUE(started.ok()) << started.status();
  const std::string id = started->id;
  for (const auto& [rank, f] : Fragments(id)) {
    EXPECT_EQ(f.plan_id(), id);
    WorkerReport r = FinalReport(f);
    v1::StepTiming* step = r.timing.add_steps();
    step->set_op("all_gather");
    step->set_index(rank);
    ASSERT_TRUE(plans_.Report(r).ok()) << rank;
  }
  EXPECT_EQ(plans_.Progress(id)->state, PlanState::kCommitted);
  absl::StatusOr<v1::PlanTrace> trace = plans_.Trace(id);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->op(), "redistribute");
  ASSERT_EQ(trace->ranks_size(), 4);
  for (const v1::RankTrace& r : trace->ranks()) {
    ASSERT_EQ(r.steps_size(), 1) << r.rank();
    EXPECT_EQ(r.steps(0).index(), r.rank());
    EXPECT_EQ(r.worker(), absl::StrCat("w", r.rank()));
  }
  EXPECT_GT(trace->transferred_unix_us(), 0);
  std::vector<v1::PlanSummary> list = plans_.List(10);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].group(), "");
  absl::Status late = plans_.Report(FinalReport(Fragments(id).begin()->second));
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(late.message(), absl::StrCat("plan ", id, " already ended (COMMITTED)"));
}

// A group's workers report under the group's id; its members' ids are no transactions.
TEST_F(PlanManagerTest, GroupMembersAreNotReportedToOnTheirOwn) {
  CreateTensor("a", "S(0),R");
  CreateTensor("x", "S(1)", "N");
  absl::StatusOr<StartedGroup> group = plans_.CopyGroup({{"a", "x"}}, nullptr);
  ASSERT_TRUE(group.ok()) << group.status();
  WorkerReport r = FusedFinalReport(Fragments(group->id).begin()->second);
  r.plan_id = group->members[0].id;
  EXPECT_EQ(plans_.Report(r).code(), absl::StatusCode::kNotFound);
  ReportAllFused(group->id);
  EXPECT_EQ(plans_.Progress(group->members[0].id)->state, PlanState::kCommitted);
  std::vector<v1::PlanSummary> list = plans_.List(10);
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].group(), group->id);
  absl::Status late = plans_.Report(FusedFinalReport(Fragments(group->id).begin()->second));
  EXPECT_EQ(late.message(), absl::StrCat("plan ", group->id, " already ended (committing)"));
}

TEST_F(PlanManagerTest, WorkerErrorAbortsEverywhereAndKeepsTheOldLayout) {
  CreateTensor("T");
  const TensorRecord before = *tensors_.Get("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started =
      plans_.Redistribute("T", Target("S(1)", "N"), Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  std::map<int64_t, v1::PlanFragment> fragments = Fragments(started->id);
  ASSERT_TRUE(plans_.Report(FinalReport(fragments[0])).ok());

  WorkerReport failed;
  failed.plan_id = started->id;
  failed.rank = 2;
  failed.worker = "w2";
  failed.incarnation = Incarnation(2);
  failed.error = "step 0 (all_to_all): gloo timeout";
  ASSERT_TRUE(plans_.Report(failed).ok());
  // Doomed but not aborted during the grace: later final reports are taken, nothing commits.
  ASSERT_TRUE(plans_.Report(FinalReport(fragments[1])).ok());
  ASSERT_TRUE(plans_.Report(FinalReport(fragments[3])).ok());
  EXPECT_FALSE(done.has_value());
  timer_.Advance(absl::Seconds(2));

  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(),
              HasSubstr("worker w2 (rank 2) failed: step 0 (all_to_all): gloo timeout"));
  EXPECT_EQ(done->progress.state, PlanState::kAborted);
  EXPECT_THAT(done->progress.error, HasSubstr("worker w2 (rank 2)"));

  EXPECT_EQ(CountFinishes(/*commit=*/false, fragments[0].target_version()), 4);

  const TensorRecord after = *tensors_.Get("T");
  EXPECT_EQ(after.layout, before.layout);
  EXPECT_EQ(after.version, before.version);
  EXPECT_EQ(after.mesh, "M");
  EXPECT_TRUE(after.busy_plan.empty());
  // The target mesh is no longer held by the aborted plan.
  EXPECT_TRUE(meshes_.Delete("N").ok());
  EXPECT_EQ(plans_.Report(FinalReport(fragments[2])).code(), absl::StatusCode::kAborted);

  // The abort retired the epoch: its keys are deleted and the next plan meets under new ones,
  // since some members may hold broken communicators of the old epoch.
  EXPECT_THAT(ended_prefixes_, ElementsAre("shardcoord/comm/0/"));
  absl::StatusOr<StartedPlan> next = plans_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(Fragments(next->id)[0].communicator_prefix(), "shardcoord/comm/1/");
}

TEST_F(PlanManagerTest, AnAbortKeepsItsEpochsKeysUntilTheEpochsOtherPlansEnd) {
  CreateTensor("T");
  CreateTensor("U");
  std::optional<PlanOutcome> t_done, u_done;
  absl::StatusOr<StartedPlan> t = plans_.Redistribute("T", Target("R,S(1)"), Record(&t_done));
  ASSERT_TRUE(t.ok()) << t.status();
  absl::StatusOr<StartedPlan> u = plans_.Redistribute("U", Target("R,S(1)"), Record(&u_done));
  ASSERT_TRUE(u.ok()) << u.status();
  ASSERT_EQ(Fragments(u->id)[0].communicator_prefix(), "shardcoord/comm/0/");
  WorkerReport failed;
  failed.plan_id = t->id;
  failed.rank = 2;
  failed.worker = "w2";
  failed.incarnation = Incarnation(2);
  failed.error = "step 0 (all_to_all): gloo timeout";
  ASSERT_TRUE(plans_.Report(failed).ok());
  timer_.Advance(absl::Seconds(10));
  ASSERT_TRUE(t_done.has_value());
  EXPECT_EQ(t_done->progress.state, PlanState::kAborted);
  // U's ranks may still be meeting under epoch 0's keys: they stay.
  EXPECT_THAT(ended_prefixes_, ElementsAre(""));
  ReportAll(u->id);
  ASSERT_TRUE(u_done.has_value());
  EXPECT_EQ(u_done->progress.state, PlanState::kCommitted);
  EXPECT_THAT(ended_prefixes_, ElementsAre("", "shardcoord/comm/0/"));
}

TEST_F(PlanManagerTest, APeerErrorFollowedByADeathNamesTheDeadRank) {
  CreateTensor("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  auto heartbeat_all_but_3 = [&] {
    for (int64_t r = 0; r < 3; ++r) {
      ASSERT_TRUE(workers_.Heartbeat(absl::StrCat("w", r), Incarnation(r)).ok());
    }
  };
  // w3 went silent at the start; 4s later its peer's transport fails.
  timer_.Advance(absl::Seconds(4));
  heartbeat_all_but_3();
  WorkerReport echo;
  echo.plan_id = started->id;
  echo.rank = 1;
  echo.worker = "w1";
  echo.incarnation = Incarnation(1);
  echo.error = "allgatherv failed: Connection closed by peer";
  ASSERT_TRUE(plans_.Report(echo).ok());
  EXPECT_FALSE(done.has_value());
  // 1.5s into the 2s grace the health check declares w3 dead (5.5s > 5s).
  timer_.Advance(absl::Milliseconds(1500));
  heartbeat_all_but_3();
  workers_.CheckHealth(clock_.Now());
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(),
              HasSubstr("aborted: worker w3 (rank 3) died: no heartbeat for 5.5s (timeout 5s); "
                        "before that, worker w1 (rank 1) failed: allgatherv failed: "
                        "Connection closed by peer"));
  // The grace timer was cancelled with the abort.
  EXPECT_EQ(timer_.pending(), 0u);
}

TEST_F(PlanManagerTest, DeathOfAParticipantAbortsNamingTheRank) {
  CreateTensor("T");
  const TensorRecord before = *tensors_.Get("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  ReportAll(started->id, /*skip=*/{3});
  EXPECT_FALSE(done.has_value());

  Kill(3);
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(), HasSubstr("worker w3 (rank 3) died: no heartbeat for 6s"));
  EXPECT_EQ(tensors_.Get("T")->layout, before.layout);

  // Rows [4:8) still have a live replica on rank 2: nothing is lost, and a plan onto live
  // workers reads from the live replicas only.
  EXPECT_TRUE(LostChunks(*tensors_.Get("T"), [&](int64_t r, int64_t inc) {
                return workers_.IsLive(r, inc);
              }).empty());
  absl::Status dead_target = plans_.Redistribute("T", Target("R,S(1)"), nullptr).status();
  EXPECT_EQ(dead_target.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(dead_target.message(), HasSubstr("worker w3 (rank 3)"));
  ASSERT_TRUE(meshes_.Create("live", {3}, {}, {"w0", "w1", "w2"}).ok());
  std::optional<PlanOutcome> done2;
  absl::StatusOr<StartedPlan> again =
      plans_.Redistribute("T", Target("S(0)", "live"), Record(&done2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->plan->source.Find(3), nullptr);
  std::map<int64_t, v1::PlanFragment> fragments = Fragments(again->id);
  EXPECT_EQ(fragments.count(3), 0u);
  ReportAll(again->id);
  ASSERT_TRUE(done2.has_value());
  EXPECT_TRUE(done2->status.ok()) << done2->status;
  EXPECT_EQ(tensors_.Get("T")->mesh, "live");
}

TEST_F(PlanManagerTest, LostChunksFailBeforeAnythingStarts) {
  CreateTensor("T");
  Kill(2);
  Kill(3);
  absl::Status s = plans_.Redistribute("T", Target("S(0)", "two"), nullptr).status();
  // Mesh "two" does not exist yet: NOT_FOUND comes first.
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(meshes_.Create("two", {2}, {}, {"w0", "w1"}).ok());
  s = plans_.Redistribute("T", Target("S(0)", "two"), nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "tensor 'T' lost 1 chunk with no live replica: [4:8, 0:4] on ranks 2, 3");
  EXPECT_TRUE(tensors_.Get("T")->busy_plan.empty());
  EXPECT_EQ(client_.calls("Execute"), 0);
}

TEST_F(PlanManagerTest, BusyTensorIsAbortedWhileOtherTensorsRunConcurrently) {
  CreateTensor("T");
  CreateTensor("U");
  client_.HoldExecutes(true);
  std::optional<PlanOutcome> t_done, u_done;
  absl::StatusOr<StartedPlan> t = plans_.Redistribute("T", Target("R,S(1)"), Record(&t_done));
  ASSERT_TRUE(t.ok());
  absl::Status second = plans_.Redistribute("T", Target("R,R"), nullptr).status();
  EXPECT_EQ(second.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(second.message(), HasSubstr("busy with " + t->id));
  EXPECT_EQ(plans_.Gather("T", "", std::nullopt, nullptr).status().code(),
            absl::StatusCode::kAborted);

  absl::StatusOr<StartedPlan> u = plans_.Redistribute("U", Target("R,S(1)"), Record(&u_done));
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(plans_.Progress(t->id)->state, PlanState::kPending);
  // Reports may arrive before Execute answers; the plan waits for both.
  ReportAll(t->id);
  ReportAll(u->id);
  EXPECT_FALSE(t_done.has_value());
  client_.ReleaseExecutes();
  ASSERT_TRUE(t_done.has_value() && u_done.has_value());
  EXPECT_TRUE(t_done->status.ok()) << t_done->status;
  EXPECT_TRUE(u_done->status.ok()) << u_done->status;
}

TEST_F(PlanManagerTest, ReplicaChecksumMismatchAborts) {
  CreateTensor("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(started.ok());
  // R,S(1) on 2x2: ranks 0 and 2 both hold columns [0:2).
  for (const auto& [rank, f] : Fragments(started->id)) {
    WorkerReport r = FinalReport(f);
    if (rank == 2) r.checksums[0] ^= 0xff;
    ASSERT_TRUE(plans_.Report(r).ok());
  }
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(),
              HasSubstr("validation failed: replicas of chunk [0:8, 0:2] disagree"));
  EXPECT_THAT(done->status.message(), HasSubstr("on worker w0 (rank 0)"));
  EXPECT_THAT(done->status.message(), HasSubstr("on worker w2 (rank 2)"));
  EXPECT_EQ(tensors_.Get("T")->spec, "S(0),R");
}

TEST_F(PlanManagerTest, WrongReportedChunksAbort) {
  CreateTensor("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(started.ok());
  for (const auto& [rank, f] : Fragments(started->id)) {
    WorkerReport r = FinalReport(f);
    if (rank == 1) r.chunks.chunks[0].box = Box({0, 0}, {8, 2});
    ASSERT_TRUE(plans_.Report(r).ok());
  }
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(),
              HasSubstr("worker w1 (rank 1) reported chunks {[0:8, 0:2]@0} but the plan's "
                        "target for it is {[0:8, 2:4]@0}"));
}

TEST_F(PlanManagerTest, StaleIncarnationIsRejectedAndReRegistrationAborts) {
  CreateTensor("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(started.ok());
  WorkerReport stale = FinalReport(Fragments(started->id)[1]);
  stale.incarnation -= 1;
  EXPECT_EQ(plans_.Report(stale).code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(done.has_value());
  WorkerReport outsider = stale;
  outsider.rank = 9;
  EXPECT_EQ(plans_.Report(outsider).code(), absl::StatusCode::kInvalidArgument);
  WorkerReport unknown = stale;
  unknown.plan_id = "p-404";
  EXPECT_EQ(plans_.Report(unknown).code(), absl::StatusCode::kNotFound);

  // w1 restarts: its fragment is gone with it.
  ASSERT_TRUE(workers_.Register(WorkerSpec{"w1", "h", "cpu", "w1:2", "gloo"}).ok());
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(), HasSubstr("worker w1 (rank 1) re-registered"));
}

TEST_F(PlanManagerTest, ExecuteFailureAndTimeoutAbort) {
  CreateTensor("T");
  CreateTensor("U");
  client_.Fail("Execute", 1, absl::UnavailableError("connection refused"));
  std::optional<PlanOutcome> failed;
  ASSERT_TRUE(plans_.Redistribute("T", Target("R,S(1)"), Record(&failed)).ok());
  ASSERT_TRUE(failed.has_value());
  EXPECT_THAT(failed->status.message(),
              HasSubstr("worker w1 (rank 1) could not start its fragment: UNAVAILABLE: "
                        "connection refused"));
  EXPECT_TRUE(tensors_.Get("T")->busy_plan.empty());

  client_.Fail("Execute", 1, absl::OkStatus());
  std::optional<PlanOutcome> timed_out;
  absl::StatusOr<StartedPlan> u = plans_.Redistribute("U", Target("R,S(1)"), Record(&timed_out));
  ASSERT_TRUE(u.ok());
  ReportAll(u->id, /*skip=*/{0, 3});
  timer_.Advance(absl::Seconds(59));
  EXPECT_FALSE(timed_out.has_value());
  timer_.Advance(absl::Seconds(1));
  ASSERT_TRUE(timed_out.has_value());
  EXPECT_EQ(timed_out->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(timed_out->status.message(),
              HasSubstr("timed out after 1m in state PREPARED; waiting for worker w0 (rank 0) "
                        "(no final report), worker w3 (rank 3) (no final report)"));
}

TEST_F(PlanManagerTest, GatherToOneRank) {
  CreateTensor("T", "S(0),S(1)");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Gather("T", "", int64_t{2}, Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_EQ(started->plan->target.ranks().size(), 1u);
  EXPECT_EQ(started->plan->target.ranks()[0].rank, 2);
  EXPECT_EQ(started->plan->target.ranks()[0].chunks[0].box, Box({0, 0}, {8, 4}));
  ReportAll(started->id);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
  const TensorRecord t = *tensors_.Get("T");
  EXPECT_EQ(t.mesh, "");
  EXPECT_EQ(t.spec, "rank 2");
  EXPECT_TRUE(meshes_.Delete("M").ok());
  // With no mesh, a redistribute must name one.
  EXPECT_EQ(plans_.Redistribute("T", Target("S(0)"), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(plans_.Gather("T", "", int64_t{17}, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(PlanManagerTest, GatherToAMeshReplicatesEverywhere) {
  CreateTensor("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Gather("T", "N", std::nullopt, Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  ReportAll(started->id);
  ASSERT_TRUE(done.has_value() && done->status.ok());
  EXPECT_EQ(tensors_.Get("T")->spec, "R");
  EXPECT_EQ(tensors_.Get("T")->mesh, "N");
}

TEST_F(PlanManagerTest, DryRunSendsNothingAndBadSpecsAreInvalid) {
  CreateTensor("T");
  absl::StatusOr<StartedPlan> dry = plans_.DryRun("T", Target("R,S(1)"));
  ASSERT_TRUE(dry.ok()) << dry.status();
  EXPECT_TRUE(dry->id.empty());
  EXPECT_GT(dry->plan->bytes_moved, 0);
  EXPECT_EQ(client_.calls("Execute"), 0);
  EXPECT_TRUE(tensors_.Get("T")->busy_plan.empty());
  absl::Status bad = plans_.DryRun("T", Target("R,S(5)")).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.message(), "target.placements[1]: S(5) on a 2-d tensor");
  EXPECT_EQ(plans_.Redistribute("T", Target("R,S(5)"), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(tensors_.Get("T")->busy_plan.empty());
  EXPECT_EQ(plans_.DryRun("nope", Target("R")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(plans_.DryRun("T", Target("R", "nomesh")).status().code(), absl::StatusCode::kNotFound);
  // The second identical plan comes from the cache.
  ASSERT_TRUE(plans_.DryRun("T", Target("R,S(1)")).ok());
  EXPECT_GE(plans_.cache_hits(), 1);
}

TEST_F(PlanManagerTest, WatchingAnEndedPlanGetsItsFinalStateOnce) {
  CreateTensor("T");
  absl::StatusOr<StartedPlan> started = plans_.Redistribute("T", Target("R,S(1)"), nullptr);
  ASSERT_TRUE(started.ok());
  ReportAll(started->id);
  std::vector<PlanProgress> seen;
  absl::StatusOr<int64_t> w =
      plans_.Watch(started->id, [&](const PlanProgress& p) { seen.push_back(p); });
  ASSERT_TRUE(w.ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].state, PlanState::kCommitted);
  EXPECT_EQ(plans_.Watch("p-404", [](const PlanProgress&) {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(PlanManagerTest, ShutdownAbortsRunningPlansAndRefusesNewOnes) {
  CreateTensor("T");
  CreateTensor("U");
  std::optional<PlanOutcome> done;
  ASSERT_TRUE(plans_.Redistribute("T", Target("R,S(1)"), Record(&done)).ok());
  plans_.Shutdown("coordinator shutting down");
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(), HasSubstr("coordinator shutting down"));
  EXPECT_EQ(plans_.Redistribute("U", Target("R,S(1)"), nullptr).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_TRUE(tensors_.Get("U")->busy_plan.empty());
}

// ---- Copy --------------------------------------------------------------------------------

TEST_F(PlanManagerTest, CopyWritesDstsNewVersionAndLeavesSrcAlone) {
  CreateTensor("src", "S(0),R");
  CreateTensor("dst", "S(1)", "N");
  const TensorRecord src_before = *tensors_.Get("src");
  const TensorRecord dst_before = *tensors_.Get("dst");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Copy("src", "dst", Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->tensor, "dst");
  EXPECT_EQ(started->plan->source, src_before.layout);
  EXPECT_EQ(started->plan->target, dst_before.layout);
  EXPECT_EQ(started->plan->bytes_moved, started->plan->lower_bound_bytes);
  // Both are busy with the plan: a second plan on either is refused.
  EXPECT_EQ(tensors_.Get("src")->busy_plan, started->id);
  EXPECT_EQ(tensors_.Get("dst")->busy_plan, started->id);
  EXPECT_EQ(plans_.Redistribute("src", Target("R,R"), nullptr).status().code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(plans_.Copy("dst", "src", nullptr).status().code(), absl::StatusCode::kAborted);

  std::map<int64_t, v1::PlanFragment> fragments = Fragments(started->id);
  ASSERT_EQ(fragments.size(), 4u);
  for (const auto& [rank, f] : fragments) {
    EXPECT_EQ(f.tensor(), "src");
    EXPECT_EQ(f.target_tensor(), "dst");
    EXPECT_EQ(f.source_version(), src_before.version);
    EXPECT_EQ(f.target_version(), started->target_version);
  }
  ReportAll(started->id);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
  EXPECT_EQ(done->progress.tensor, "dst");

  const TensorRecord dst_after = *tensors_.Get("dst");
  EXPECT_EQ(dst_after.version, started->target_version);
  EXPECT_GT(dst_after.version, dst_before.version);
  EXPECT_EQ(dst_after.layout, dst_before.layout);
  EXPECT_EQ(dst_after.mesh, "N");
  EXPECT_EQ(dst_after.spec, "S(1)");
  EXPECT_TRUE(dst_after.busy_plan.empty());
  const TensorRecord src_after = *tensors_.Get("src");
  EXPECT_EQ(src_after.version, src_before.version);
  EXPECT_EQ(src_after.layout, src_before.layout);
  EXPECT_EQ(src_after.checksums, src_before.checksums);
  EXPECT_TRUE(src_after.busy_plan.empty());
  // Workers drop dst's old version, never src's.
  int commits = 0;
  for (const auto& [rank, req] : client_.finishes()) {
    EXPECT_TRUE(req.commit());
    EXPECT_EQ(req.tensor(), "dst");
    EXPECT_EQ(req.drop_version(), dst_before.version);
    ++commits;
  }
  EXPECT_EQ(commits, 4);
  // dst still uses N only; src still uses M.
  EXPECT_EQ(meshes_.Delete("N").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(meshes_.Delete("M").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(tensors_.Remove("dst").ok());
  EXPECT_TRUE(meshes_.Delete("N").ok());
}

TEST_F(PlanManagerTest, CopyRefusesBadPairsBeforeAnythingStarts) {
  CreateTensor("a");
  CreateTensor("wide", "S(0),R", "M", {8, 8});
  CreateTensor("ints", "S(0),R", "M", {8, 4}, DType::kI32);
  absl::Status s = plans_.Copy("a", "a", nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'a' is also src"));
  s = plans_.Copy("a", "wide", nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "dst: tensor 'wide' has shape [8, 8] but src 'a' has shape [8, 4]");
  s = plans_.Copy("a", "ints", nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "dst: tensor 'ints' dtype i32 cannot be cast from src 'a' dtype f32: cannot cast f32 "
            "to i32 (float to integer is not a cast copies make)");
  EXPECT_EQ(plans_.Copy("a", "nope", nullptr).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(plans_.Copy("nope", "a", nullptr).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_.calls("Execute"), 0);
  for (const char* name : {"a", "wide", "ints"}) {
    EXPECT_TRUE(tensors_.Get(name)->busy_plan.empty()) << name;
  }
}

TEST_F(PlanManagerTest, CopyOntoOrFromABusyTensorIsAbortedAndReleasesTheOther) {
  CreateTensor("a");
  CreateTensor("b");
  CreateTensor("c");
  client_.HoldExecutes(true);
  absl::StatusOr<StartedPlan> running = plans_.Redistribute("b", Target("R,S(1)"), nullptr);
  ASSERT_TRUE(running.ok());
  absl::Status s = plans_.Copy("a", "b", nullptr).status();  // dst busy.
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("busy with " + running->id));
  EXPECT_TRUE(tensors_.Get("a")->busy_plan.empty());
  s = plans_.Copy("b", "c", nullptr).status();  // src busy.
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(tensors_.Get("c")->busy_plan.empty());
  // Copies of other tensors run meanwhile.
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> copy = plans_.Copy("a", "c", Record(&done));
  ASSERT_TRUE(copy.ok()) << copy.status();
  client_.ReleaseExecutes();
  ReportAll(copy->id);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->status.ok()) << done->status;
}

TEST_F(PlanManagerTest, CopyFailureMidwayKeepsBothVersions) {
  CreateTensor("src", "S(0),R");
  CreateTensor("dst", "R,S(1)");
  const TensorRecord src_before = *tensors_.Get("src");
  const TensorRecord dst_before = *tensors_.Get("dst");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = plans_.Copy("src", "dst", Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  std::map<int64_t, v1::PlanFragment> fragments = Fragments(started->id);
  ASSERT_TRUE(plans_.Report(FinalReport(fragments[0])).ok());
  WorkerReport failed;
  failed.plan_id = started->id;
  failed.rank = 1;
  failed.worker = "w1";
  failed.incarnation = Incarnation(1);
  failed.error = "step 0 (all_to_all): gloo timeout";
  ASSERT_TRUE(plans_.Report(failed).ok());
  timer_.Advance(absl::Seconds(2));

  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(), HasSubstr("on tensor 'dst' (copy of 'src') aborted"));
  EXPECT_THAT(done->status.message(), HasSubstr("worker w1 (rank 1) failed"));
  // Every participant drops dst's new buffers.
  int aborts = 0;
  for (const auto& [rank, req] : client_.finishes()) {
    EXPECT_FALSE(req.commit());
    EXPECT_EQ(req.tensor(), "dst");
    EXPECT_EQ(req.drop_version(), started->target_version);
    ++aborts;
  }
  EXPECT_EQ(aborts, 4);
  for (const auto& [name, before] :
       {std::make_pair("src", src_before), std::make_pair("dst", dst_before)}) {
    const TensorRecord after = *tensors_.Get(name);
    EXPECT_EQ(after.version, before.version) << name;
    EXPECT_EQ(after.layout, before.layout) << name;
    EXPECT_EQ(after.checksums, before.checksums) << name;
    EXPECT_TRUE(after.busy_plan.empty()) << name;
  }
  // Both are free for the next plan.
  std::optional<PlanOutcome> again;
  absl::StatusOr<StartedPlan> next = plans_.Copy("src", "dst", Record(&again));
  ASSERT_TRUE(next.ok()) << next.status();
  ReportAll(next->id);
  ASSERT_TRUE(again.has_value());
  EXPECT_TRUE(again->status.ok()) << again->status;
  EXPECT_EQ(tensors_.Get("dst")->version, next->target_version);
  EXPECT_EQ(tensors_.Get("src")->version, src_before.version);
}

TEST_F(PlanManagerTest, CopyFromLostChunksFailsAndOntoADeadWorkerToo) {
  CreateTensor("src");
  ASSERT_TRUE(meshes_.Create("two", {2}, {}, {"w0", "w1"}).ok());
  CreateTensor("dst", "S(0)", "two");
  Kill(2);
  Kill(3);
  // src's rows [4:8) had their only holders on ranks 2 and 3.
  absl::Status s = plans_.Copy("src", "dst", nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("tensor 'src' lost 1 chunk with no live replica"));
  // dst on dead workers: as a Redistribute onto them.
  s = plans_.Copy("dst", "src", nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("in the target layout is dead"));
  EXPECT_TRUE(tensors_.Get("src")->busy_plan.empty());
  EXPECT_TRUE(tensors_.Get("dst")->busy_plan.empty());
  EXPECT_EQ(client_.calls("Execute"), 0);
}

TEST_F(PlanManagerTest, CopyOfAPartialSourceReducesIntoDst) {
  CreateTensor("grad", "P,S(0)");
  CreateTensor("dst", "S(0)", "N");
  absl::StatusOr<StartedPlan> started = plans_.Copy("grad", "dst", nullptr);
  ASSERT_TRUE(started.ok()) << started.status();
  EXPECT_EQ(started->plan->source.num_partials(), 2);
  EXPECT_EQ(started->plan->target.num_partials(), 1);
  for (const auto& [rank, f] : Fragments(started->id)) {
    EXPECT_EQ(f.num_partials(), 2);
    EXPECT_EQ(f.target_tensor(), "dst");
  }
  ReportAll(started->id);
  EXPECT_EQ(tensors_.Get("dst")->version, started->target_version);
}

// ---- CopyGroup ---------------------------------------------------------------------------

struct GroupOutcome {
  absl::Status status;
  GroupProgress progress;
  int calls = 0;
};

PlanManager::GroupDoneCallback RecordGroup(GroupOutcome* out) {
  return [out](const absl::Status& s, const GroupProgress& p) {
    out->status = s;
    out->progress = p;
    ++out->calls;
  };
}

TEST(CheckCopyGroupTest, NamesTheMemberAndFieldOfEveryBadMember) {
  EXPECT_TRUE(CheckCopyGroup({{"a", "b"}, {"c", "d"}}).ok());
  absl::Status s = CheckCopyGroup({});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "copies: empty group");
  s = CheckCopyGroup({{"a", "b"}, {"", "d"}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "copies[1].src: empty");
  s = CheckCopyGroup({{"a", "b"}, {"c", ""}});
  EXPECT_EQ(s.message(), "copies[1].dst: empty");
  s = CheckCopyGroup({{"a", "a"}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "copies[0].dst: tensor 'a' is also copies[0].src; a group names each tensor once");
  s = CheckCopyGroup({{"a", "b"}, {"c", "b"}});
  EXPECT_EQ(s.message(),
            "copies[1].dst: tensor 'b' is also copies[0].dst; a group names each tensor once");
  s = CheckCopyGroup({{"a", "b"}, {"b", "c"}});
  EXPECT_EQ(s.message(),
            "copies[1].src: tensor 'b' is also copies[0].dst; a group names each tensor once");
  s = CheckCopyGroup({{"a", "b"}, {"a", "c"}});
  EXPECT_EQ(s.message(),
            "copies[1].src: tensor 'a' is also copies[0].src; a group names each tensor once");
}

TEST_F(PlanManagerTest, CopyGroupCommitsEveryDstTogether) {
  CreateTensor("a", "S(0),R");
  CreateTensor("b", "R,S(1)");
  CreateTensor("x", "S(1)", "N");
  CreateTensor("y", "S(0)", "N");
  const int64_t x_before = tensors_.Get("x")->version;
  const int64_t y_before = tensors_.Get("y")->version;
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group =
      plans_.CopyGroup({{"a", "x"}, {"b", "y"}}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->members.size(), 2u);
  EXPECT_EQ(group->members[0].tensor, "x");
  EXPECT_EQ(group->members[1].tensor, "y");
  EXPECT_EQ(group->bytes_moved,
            group->members[0].plan->bytes_moved + group->members[1].plan->bytes_moved);
  EXPECT_EQ(group->bytes_moved, group->lower_bound_bytes);
  EXPECT_EQ(group->bucket_bytes, kDefaultBucketBytes);
  const Plan* plans[] = {group->members[0].plan.get(), group->members[1].plan.get()};
  EXPECT_EQ(group->buckets, FusedExchange(plans, StreamLimitsFor(0)).messages);
  EXPECT_GT(group->buckets, 0);
  for (const char* name : {"a", "x"}) {
    EXPECT_EQ(tensors_.Get(name)->busy_plan, group->members[0].id) << name;
  }
  for (const char* name : {"b", "y"}) {
    EXPECT_EQ(tensors_.Get(name)->busy_plan, group->members[1].id) << name;
  }

  // One fragment per worker for the whole group, holding each member it takes part in.
  EXPECT_TRUE(Fragments(group->members[0].id).empty());
  std::map<int64_t, v1::PlanFragment> fragments = Fragments(group->id);
  ASSERT_EQ(fragments.size(), 4u);
  EXPECT_EQ(client_.calls("Execute"), 4);
  for (const auto& [rank, f] : fragments) {
    ASSERT_EQ(f.members_size(), 2) << rank;
    EXPECT_EQ(f.members(0).plan_id(), group->members[0].id);
    EXPECT_EQ(f.members(1).index(), 1);
    EXPECT_EQ(f.members(1).target_tensor(), "y");
    EXPECT_EQ(f.bucket_bytes(), kDefaultBucketBytes);
    EXPECT_EQ(f.communicator_prefix(), "shardcoord/comm/0/");
    EXPECT_THAT(f.exchange_ranks(), ElementsAre(0, 1, 2, 3));
    EXPECT_EQ(f.member_ranks_size(), 4);
  }
  // Every worker accepted: every member is PREPARED.
  EXPECT_EQ(plans_.Progress(group->members[0].id)->state, PlanState::kPrepared);

  // Reports from all but one worker: nothing commits yet.
  ReportAllFused(group->id, {2});
  EXPECT_EQ(done.calls, 0);
  EXPECT_EQ(tensors_.Get("x")->version, x_before);
  EXPECT_EQ(tensors_.Get("x")->busy_plan, group->members[0].id);
  EXPECT_EQ(plans_.Progress(group->members[1].id)->state, PlanState::kPrepared);
  EXPECT_TRUE(client_.finishes().empty());

  ReportAllFused(group->id, {0, 1, 3});
  ASSERT_EQ(done.calls, 1);
  EXPECT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(done.progress.group_id, group->id);
  EXPECT_EQ(done.progress.state, PlanState::kCommitted);
  ASSERT_EQ(done.progress.members.size(), 2u);
  EXPECT_EQ(done.progress.members[0].tensor, "x");
  EXPECT_EQ(done.progress.members[1].state, PlanState::kCommitted);
  EXPECT_EQ(done.progress.members[1].bytes_done, group->members[1].plan->bytes_moved);
  EXPECT_EQ(tensors_.Get("x")->version, group->members[0].target_version);
  EXPECT_EQ(tensors_.Get("y")->version, group->members[1].target_version);
  EXPECT_GT(tensors_.Get("x")->version, x_before);
  EXPECT_GT(tensors_.Get("y")->version, y_before);
  for (const char* name : {"a", "b", "x", "y"}) {
    EXPECT_TRUE(tensors_.Get(name)->busy_plan.empty()) << name;
  }
  // One FinishPlan per worker, naming every member's old version.
  ASSERT_EQ(client_.finishes().size(), 4u);
  for (const auto& [rank, req] : client_.finishes()) {
    EXPECT_TRUE(req.commit());
    EXPECT_EQ(req.plan_id(), group->id);
    ASSERT_EQ(req.members_size(), 2) << rank;
    EXPECT_EQ(req.members(0).tensor(), "x");
    EXPECT_EQ(req.members(0).drop_version(), x_before);
    EXPECT_EQ(req.members(1).drop_version(), y_before);
  }
  // Traces: the group's and its members' show the workers' exchange rounds.
  absl::StatusOr<v1::PlanTrace> trace = plans_.Trace(group->id);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->op(), "group");
  EXPECT_EQ(trace->state(), v1::COMMITTED);
  ASSERT_EQ(trace->ranks_size(), 4);
  EXPECT_EQ(trace->ranks(0).steps(0).op(), "fused_exchange");
  trace = plans_.Trace(group->members[1].id);
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->tensor(), "y");
  EXPECT_EQ(trace->ranks(0).steps(0).op(), "fused_exchange");
  EXPECT_EQ(metrics_.plans->WithLabels({"copy", "committed"})->Value(), 2);
}

TEST_F(PlanManagerTest, CopyGroupMemberFailureAbortsEveryMember) {
  CreateTensor("a", "S(0),R");
  CreateTensor("b", "R,S(1)");
  CreateTensor("x", "S(1)", "N");
  CreateTensor("y", "S(0)", "N");
  std::map<std::string, TensorRecord> before;
  for (const char* name : {"a", "b", "x", "y"}) before[name] = *tensors_.Get(name);
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group =
      plans_.CopyGroup({{"a", "x"}, {"b", "y"}}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  // Three workers report; rank 1 fails.
  ReportAllFused(group->id, {1});
  WorkerReport failed;
  failed.plan_id = group->id;
  failed.rank = 1;
  failed.worker = "w1";
  failed.incarnation = Incarnation(1);
  failed.final = true;
  failed.error = "fused exchange round 1: gloo timeout";
  ASSERT_TRUE(plans_.Report(failed).ok());
  timer_.Advance(absl::Seconds(2));

  ASSERT_EQ(done.calls, 1);
  EXPECT_EQ(done.status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done.status.message(),
              HasSubstr("worker w1 (rank 1) failed: fused exchange round 1: gloo timeout"));
  EXPECT_EQ(done.progress.state, PlanState::kAborted);
  EXPECT_EQ(done.progress.members[0].state, PlanState::kAborted);
  EXPECT_EQ(done.progress.members[1].state, PlanState::kAborted);
  for (const auto& [name, b] : before) {
    const TensorRecord after = *tensors_.Get(name);
    EXPECT_EQ(after.version, b.version) << name;
    EXPECT_EQ(after.layout, b.layout) << name;
    EXPECT_EQ(after.checksums, b.checksums) << name;
    EXPECT_TRUE(after.busy_plan.empty()) << name;
  }
  // Every worker of the group drops its new buffers: one FinishPlan each.
  int aborts = 0;
  for (const auto& [rank, req] : client_.finishes()) {
    EXPECT_FALSE(req.commit());
    EXPECT_EQ(req.plan_id(), group->id);
    ++aborts;
  }
  EXPECT_EQ(aborts, 4);
  EXPECT_EQ(metrics_.plans->WithLabels({"copy", "aborted"})->Value(), 2);
  // The abort retired the epoch's communicators.
  EXPECT_EQ(Fragments(group->id).begin()->second.communicator_prefix(), "shardcoord/comm/0/");
  EXPECT_FALSE(ended_prefixes_.empty());
}

TEST_F(PlanManagerTest, AGroupMemberThatDoesNotValidateAbortsTheGroupNamingIt) {
  CreateTensor("a", "S(0),R");
  CreateTensor("b", "R,S(1)");
  CreateTensor("x", "S(1)", "N");
  CreateTensor("y", "S(0)", "N");
  const int64_t x_before = tensors_.Get("x")->version;
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group =
      plans_.CopyGroup({{"a", "x"}, {"b", "y"}}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  ReportAllFused(group->id, {3});
  WorkerReport bad = FusedFinalReport(Fragments(group->id).at(3));
  ASSERT_EQ(bad.members.size(), 2u);
  ASSERT_EQ(bad.shapes.size(), 2u);
  bad.members[1].shape = bad.members[0].shape;  // Rank 3 claims y's chunks are x's.
  ASSERT_TRUE(plans_.Report(bad).ok());
  ASSERT_EQ(done.calls, 1);
  EXPECT_EQ(done.status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done.status.message(),
              HasSubstr("copies[1] ('b' -> 'y', plan " + group->members[1].id +
                        "): validation failed: worker w3 (rank 3) reported chunks {[0:8, 3:4]"));
  EXPECT_EQ(tensors_.Get("x")->version, x_before);
  EXPECT_TRUE(tensors_.Get("x")->busy_plan.empty());
}

TEST_F(PlanManagerTest, MembersWithTheSamePlanShareOneShapePerWorker) {
  for (const char* name : {"s0", "s1", "s2"}) CreateTensor(name, "S(0),R");
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group = plans_.RedistributeGroup(
      {{"s0", Target("S(1)", "N")}, {"s1", Target("S(1)", "N")}, {"s2", Target("R,R")}},
      RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(group->members[0].plan, group->members[1].plan);  // The plan cache's one object.
  for (const auto& [rank, f] : Fragments(group->id)) {
    EXPECT_EQ(f.shapes_size(), 2) << rank;
    ASSERT_EQ(f.members_size(), 3) << rank;
    EXPECT_EQ(f.members(0).shape(), f.members(1).shape());
    EXPECT_NE(f.members(0).shape(), f.members(2).shape());
  }
  ReportAllFused(group->id);
  ASSERT_EQ(done.calls, 1);
  EXPECT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(tensors_.Get("s1")->spec, "S(1)");
  EXPECT_EQ(tensors_.Get("s2")->spec, "R,R");
}

TEST_F(PlanManagerTest, GroupReportsAreCheckedAgainstTheGroup) {
  CreateTensor("a", "S(0),R");
  CreateTensor("x", "S(1)", "N");
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group = plans_.CopyGroup({{"a", "x"}}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  WorkerReport stale = FusedFinalReport(Fragments(group->id).at(0));
  stale.incarnation += 7;
  EXPECT_EQ(plans_.Report(stale).code(), absl::StatusCode::kAborted);
  // A member index the worker takes no part in aborts the group.
  WorkerReport wrong = FusedFinalReport(Fragments(group->id).at(0));
  wrong.members[0].index = 5;
  ASSERT_TRUE(plans_.Report(wrong).ok());
  ASSERT_EQ(done.calls, 1);
  EXPECT_THAT(done.status.message(), HasSubstr("reported member 5, which it takes no part in"));
  // Later reports for the ended group are refused.
  EXPECT_EQ(plans_.Report(FusedFinalReport(Fragments(group->id).at(1))).code(),
            absl::StatusCode::kAborted);
}

TEST_F(PlanManagerTest, AGroupUsesTheSmallestBucketSizeOfItsWorkers) {
  WorkerSpec w2{"w2", "h", "cpu", "w2:1", "gloo"};
  w2.bucket_bytes = int64_t{1} << 20;
  ASSERT_TRUE(workers_.Register(w2).ok());
  WorkerSpec w1{"w1", "h", "cpu", "w1:1", "gloo"};
  w1.bucket_bytes = int64_t{4} << 20;
  ASSERT_TRUE(workers_.Register(w1).ok());
  CreateTensor("a", "S(0),R");
  CreateTensor("x", "S(1)", "N");
  absl::StatusOr<StartedGroup> group = plans_.CopyGroup({{"a", "x"}}, nullptr);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ(group->bucket_bytes, int64_t{1} << 20);
  for (const auto& [rank, f] : Fragments(group->id)) {
    EXPECT_EQ(f.bucket_bytes(), int64_t{1} << 20) << rank;
    EXPECT_EQ(f.member_incarnations(f.member_ranks_size() - 1), Incarnation(3));
  }
}

TEST_F(PlanManagerTest, CopyGroupWithABadOrBusyMemberIsRefusedAndChangesNothing) {
  CreateTensor("a");
  CreateTensor("b");
  CreateTensor("x");
  CreateTensor("y");
  CreateTensor("wide", "S(0),R", "M", {8, 8});
  CreateTensor("ints", "S(0),R", "M", {8, 4}, DType::kI32);
  absl::Status s = plans_.CopyGroup({{"a", "x"}, {"b", "nope"}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "copies[1].dst: unknown tensor 'nope'");
  s = plans_.CopyGroup({{"nope", "x"}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "copies[0].src: unknown tensor 'nope'");
  s = plans_.CopyGroup({{"a", "x"}, {"b", "wide"}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "copies[1].dst: tensor 'wide' has shape [8, 8] but src 'b' has shape [8, 4]");
  s = plans_.CopyGroup({{"ints", "x"}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(),
              HasSubstr("copies[0].dst: tensor 'x' dtype f32 cannot be cast from src 'ints' "
                        "dtype i32"));
  s = plans_.CopyGroup({{"a", "x"}, {"x", "y"}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("copies[1].src: tensor 'x' is also copies[0].dst"));

  // y is busy: the members before it were started and are forgotten, nothing was sent.
  client_.HoldExecutes(true);
  absl::StatusOr<StartedPlan> running = plans_.Redistribute("y", Target("R,S(1)"), nullptr);
  ASSERT_TRUE(running.ok());
  const int executes = client_.calls("Execute");
  s = plans_.CopyGroup({{"a", "x"}, {"b", "y"}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(s.message(), HasSubstr("copies[1]: tensor 'y' is busy with " + running->id));
  EXPECT_EQ(client_.calls("Execute"), executes);
  EXPECT_TRUE(client_.finishes().empty());
  for (const char* name : {"a", "b", "x"}) {
    EXPECT_TRUE(tensors_.Get(name)->busy_plan.empty()) << name;
  }
  EXPECT_EQ(tensors_.Get("y")->busy_plan, running->id);
  client_.HoldExecutes(false);
  client_.ReleaseExecutes();
  // The same group runs once y is free.
  ReportAll(running->id);
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group =
      plans_.CopyGroup({{"a", "x"}, {"b", "y"}}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  ReportAllFused(group->id);
  ASSERT_EQ(done.calls, 1);
  EXPECT_TRUE(done.status.ok()) << done.status;
}

TEST_F(PlanManagerTest, CopyGroupMemberDeathAbortsTheWholeGroup) {
  CreateTensor("a");
  CreateTensor("b");
  ASSERT_TRUE(meshes_.Create("two", {2}, {}, {"w0", "w1"}).ok());
  CreateTensor("x", "S(0)", "two");
  CreateTensor("y", "R,R");
  const int64_t x_before = tensors_.Get("x")->version;
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group =
      plans_.CopyGroup({{"a", "x"}, {"b", "y"}}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  ReportAllFused(group->id, {3});
  Kill(3);  // Takes part in member 0 (a's rows [4:8)) and member 1.
  ASSERT_EQ(done.calls, 1);
  EXPECT_EQ(done.status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done.status.message(), HasSubstr("rank 3"));
  EXPECT_EQ(tensors_.Get("x")->version, x_before);
  EXPECT_TRUE(tensors_.Get("x")->busy_plan.empty());
  EXPECT_TRUE(tensors_.Get("y")->busy_plan.empty());
  // The group timed nothing out afterwards.
  timer_.Advance(absl::Minutes(2));
  EXPECT_EQ(done.calls, 1);
}

TEST_F(PlanManagerTest, AGroupThatDoesNotEndInTimeIsAborted) {
  CreateTensor("a", "S(0),R");
  CreateTensor("x", "S(1)", "N");
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group = plans_.CopyGroup({{"a", "x"}}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  ReportAllFused(group->id, {2});
  timer_.Advance(absl::Minutes(2));
  ASSERT_EQ(done.calls, 1);
  EXPECT_THAT(done.status.message(), HasSubstr("timed out"));
  EXPECT_THAT(done.status.message(), HasSubstr("worker w2 (rank 2) (no final report)"));
}

// ---- GatherGroup -------------------------------------------------------------------------

TEST_F(PlanManagerTest, GatherGroupReplicatesEveryTensorTogether) {
  CreateTensor("a", "S(0),R");
  CreateTensor("b", "R,S(1)");
  EXPECT_EQ(CheckGatherGroup({}).message(), "tensors: empty group");
  EXPECT_EQ(CheckGatherGroup({"a", ""}).message(), "tensors[1]: empty");
  EXPECT_THAT(CheckGatherGroup({"a", "b", "a"}).message(),
              HasSubstr("tensors[2]: tensor 'a' is also tensors[0]"));
  absl::Status s = plans_.GatherGroup({"a", "nope"}, "", std::nullopt, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "tensors[1]: unknown tensor 'nope'");
  s = plans_.GatherGroup({"a"}, "nomesh", std::nullopt, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_.calls("Execute"), 0);

  GroupOutcome done;
  absl::StatusOr<StartedGroup> group =
      plans_.GatherGroup({"a", "b"}, "", int64_t{2}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  ReportAllFused(group->id);
  ASSERT_EQ(done.calls, 1);
  EXPECT_TRUE(done.status.ok()) << done.status;
  for (const char* name : {"a", "b"}) {
    const TensorRecord t = *tensors_.Get(name);
    EXPECT_EQ(t.spec, "rank 2") << name;
    ASSERT_EQ(t.layout.ranks().size(), 1u);
    EXPECT_EQ(t.layout.ranks()[0].rank, 2);
  }
  EXPECT_EQ(metrics_.plans->WithLabels({"gather", "committed"})->Value(), 2);
}

// ---- RedistributeGroup -------------------------------------------------------------------

TEST(CheckRedistributeGroupTest, NamesTheMemberOfEveryBadMember) {
  EXPECT_TRUE(CheckRedistributeGroup({{"a", {}}, {"b", {}}}).ok());
  EXPECT_EQ(CheckRedistributeGroup({}).message(), "redistributes: empty group");
  EXPECT_EQ(CheckRedistributeGroup({{"a", {}}, {"", {}}}).message(),
            "redistributes[1].tensor: empty");
  absl::Status s = CheckRedistributeGroup({{"a", {}}, {"b", {}}, {"a", {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "redistributes[2].tensor: tensor 'a' is also redistributes[0].tensor; a group names "
            "each tensor once");
}

TEST_F(PlanManagerTest, RedistributeGroupCommitsEveryTensorTogetherOrNone) {
  CreateTensor("a", "S(0),R");
  CreateTensor("b", "R,S(1)");
  const TensorRecord a_before = *tensors_.Get("a");
  const TensorRecord b_before = *tensors_.Get("b");
  // A bad spec or an unknown tensor refuses the group before anything starts.
  absl::Status s =
      plans_.RedistributeGroup({{"a", Target("R,R")}, {"b", Target("S(0)")}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("redistributes[1].target"));
  s = plans_.RedistributeGroup({{"a", Target("R,R")}, {"nope", Target("R,R")}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "redistributes[1].tensor: unknown tensor 'nope'");
  s = plans_.RedistributeGroup({{"a", Target("S(0)", "nomesh")}}, nullptr).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("redistributes[0]: "));
  EXPECT_EQ(client_.calls("Execute"), 0);

  GroupOutcome done;
  absl::StatusOr<StartedGroup> group = plans_.RedistributeGroup(
      {{"a", Target("S(1)", "N")}, {"b", Target("R,R")}}, RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  ReportAllFused(group->id, {0});
  EXPECT_EQ(tensors_.Get("a")->version, a_before.version);
  ReportAllFused(group->id, {1, 2, 3});
  ASSERT_EQ(done.calls, 1);
  EXPECT_TRUE(done.status.ok()) << done.status;
  EXPECT_EQ(tensors_.Get("a")->version, group->members[0].target_version);
  EXPECT_EQ(tensors_.Get("a")->mesh, "N");
  EXPECT_EQ(tensors_.Get("a")->spec, "S(1)");
  EXPECT_EQ(tensors_.Get("b")->version, group->members[1].target_version);
  EXPECT_EQ(tensors_.Get("b")->spec, "R,R");

  // A failing member rolls both back.
  const TensorRecord a_mid = *tensors_.Get("a");
  const TensorRecord b_mid = *tensors_.Get("b");
  GroupOutcome failed;
  group = plans_.RedistributeGroup({{"a", Target("S(0)")}, {"b", Target("S(0),R")}},
                                   RecordGroup(&failed));
  ASSERT_TRUE(group.ok()) << group.status();
  ReportAllFused(group->id, {3});
  plans_.Abort(group->members[0].id, "test");
  ASSERT_EQ(failed.calls, 1);
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(failed.status.message(), HasSubstr("redistributes[0] ('a' -> S(0), plan "));
  EXPECT_EQ(tensors_.Get("a")->version, a_mid.version);
  EXPECT_EQ(tensors_.Get("a")->layout, a_mid.layout);
  EXPECT_EQ(tensors_.Get("b")->version, b_mid.version);
  EXPECT_EQ(tensors_.Get("b")->layout, b_mid.layout);
  EXPECT_TRUE(tensors_.Get("a")->busy_plan.empty());
  EXPECT_TRUE(tensors_.Get("b")->busy_plan.empty());
}

TEST_F(PlanManagerTest, GroupMembersWithEqualInputsShareOnePlanOthersGetTheirOwn) {
  // a, b: equal tensors moved alike (the second reuses the first's plan); c: the same layout
  // in another dtype; d: from another layout; e: to another spec; f: alike again.
  CreateTensor("a");
  CreateTensor("b");
  CreateTensor("c", "S(0),R", "M", {8, 4}, DType::kF64);
  CreateTensor("d", "R,S(1)");
  CreateTensor("e");
  CreateTensor("f");
  const Spec to = Target("S(1)", "N");
  GroupOutcome done;
  absl::StatusOr<StartedGroup> group = plans_.RedistributeGroup(
      {{"a", to}, {"b", to}, {"c", to}, {"d", to}, {"e", Target("R,R")}, {"f", Target("R,R")}},
      RecordGroup(&done));
  ASSERT_TRUE(group.ok()) << group.status();
  const std::vector<StartedPlan>& m = group->members;
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m[0].plan, m[1].plan);
  EXPECT_NE(m[1].plan, m[2].plan);
  EXPECT_EQ(m[2].plan->dtype, DType::kF64);
  EXPECT_NE(m[2].plan, m[3].plan);
  EXPECT_EQ(m[3].plan->source, tensors_.Get("d")->layout);
  EXPECT_NE(m[3].plan, m[4].plan);
  EXPECT_EQ(m[4].plan, m[5].plan);
  const Layout on_n =
      *Layout::FromPlacements(meshes_.Get("N")->mesh, {8, 4}, *ParsePlacements("S(1)"));
  const Layout replicated =
      *Layout::FromPlacements(meshes_.Get("M")->mesh, {8, 4}, *ParsePlacements("R,R"));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(m[i].plan->target, on_n) << i;
  EXPECT_EQ(m[4].plan->target, replicated);
  ReportAllFused(group->id);
  ASSERT_EQ(done.calls, 1);
  EXPECT_TRUE(done.status.ok()) << done.status;
  for (const char* t : {"a", "b", "c", "d"}) EXPECT_EQ(tensors_.Get(t)->spec, "S(1)") << t;
  for (const char* t : {"e", "f"}) EXPECT_EQ(tensors_.Get(t)->layout, replicated) << t;
}

// ---- Small plans relayed through the coordinator (plan_relay.h) ------------------------------

class RelayedPlanTest : public PlanManagerTest {
 protected:
  RelayedPlanTest() : relay_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, With()) {}

  PlanManagerOptions With() {
    PlanManagerOptions o = Options();
    o.relay_max_bytes = kDefaultRelayMaxBytes;
    return o;
  }

  // Stores tensor `name`'s buffers in the fake workers: element i of the whole f32 tensor
  // holds the value i.
  void StoreBuffers(const std::string& name) {
    const TensorRecord t = *tensors_.Get(name);
    for (const RankChunks& rc : t.layout.ranks()) {
      v1::ChunkData header;
      header.set_tensor(name);
      header.set_version(t.version);
      header.set_dtype(DTypeToProto(t.dtype));
      *header.mutable_chunks() = RankChunksToProto(rc);
      header.set_total_bytes(rc.local_elements * 4);
      client_.WriteChunk(*Endpoint(rc.rank), header, Local(rc, t.shape),
                         [](absl::StatusOr<v1::WriteChunkResponse> r) { ASSERT_TRUE(r.ok()); });
    }
  }

  std::optional<WorkerEndpoint> Endpoint(int64_t rank) {
    absl::StatusOr<WorkerRecord> w = workers_.GetByRank(rank);
    if (!w.ok()) return std::nullopt;
    return WorkerEndpoint{w->spec.name, w->rank, w->spec.address, w->incarnation};
  }

  static std::string Local(const RankChunks& rc, const Shape& shape) {
    std::string out(static_cast<size_t>(rc.local_elements * 4), '\0');
    for (const Chunk& c : rc.chunks) {
      std::vector<float> whole(static_cast<size_t>(Box::Whole(shape).Volume()));
      for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<float>(i);
      EXPECT_TRUE(
          PackBox(c.box, whole.data(), Box::Whole(shape), out.data() + c.local_offset * 4, 4).ok());
    }
    return out;
  }

  PlanManager relay_;
};

TEST_F(RelayedPlanTest, ASmallPlanIsMovedByTheCoordinatorAndCommitsLikeAnExecutedOne) {
  CreateTensor("T");
  StoreBuffers("T");
  const TensorRecord before = *tensors_.Get("T");
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = relay_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  // The fake answers inline: read, laid out, written, validated and committed.
  ASSERT_TRUE(done.has_value());
  ASSERT_TRUE(done->status.ok()) << done->status;
  EXPECT_EQ(done->progress.state, PlanState::kCommitted);
  EXPECT_EQ(client_.calls("Execute"), 0);  // No fragment went to any worker.
  const TensorRecord after = *tensors_.Get("T");
  EXPECT_EQ(after.version, started->target_version);
  EXPECT_EQ(after.layout, started->plan->target);
  for (const RankChunks& rc : after.layout.ranks()) {
    EXPECT_EQ(client_.Buffer(rc.rank, "T", after.version), Local(rc, after.shape))
        << "rank " << rc.rank;
  }
  // FinishPlan drops the old version everywhere, as after an executed plan.
  EXPECT_EQ(CountFinishes(/*commit=*/true, before.version), 4);
  EXPECT_EQ(client_.BufferCount("T"), 4);
  // Its trace says who got what.
  absl::StatusOr<v1::PlanTrace> trace = relay_.Trace(started->id);
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->ranks_size(), 4);
  EXPECT_EQ(trace->ranks(0).steps(0).op(), "relay_write");
  EXPECT_GT(trace->ranks(0).end_unix_us(), 0);
}

TEST_F(RelayedPlanTest, AFailedWriteAbortsAndDropsTheNewVersionEverywhere) {
  CreateTensor("T");
  StoreBuffers("T");
  const TensorRecord before = *tensors_.Get("T");
  client_.Fail("WriteChunk", 3, absl::UnavailableError("connection reset"));
  std::optional<PlanOutcome> done;
  absl::StatusOr<StartedPlan> started = relay_.Redistribute("T", Target("R,S(1)"), Record(&done));
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->status.message(), HasSubstr("relay failed"));
  EXPECT_THAT(done->status.message(), HasSubstr("worker w3 (rank 3)"));
  // The old version is still the tensor's, and only its buffers remain.
  EXPECT_EQ(tensors_.Get("T")->version, before.version);
  EXPECT_TRUE(tensors_.Get("T")->busy_plan.empty());
  int drops = 0;
  for (const auto& [rank, req] : client_.drops()) {
    EXPECT_EQ(req.version(), started->target_version);
    ++drops;
  }
  EXPECT_EQ(drops, 4);
  EXPECT_EQ(client_.BufferCount("T"), 4);
  for (int64_t r = 0; r < 4; ++r) EXPECT_FALSE(client_.HasBuffer(r, "T", started->target_version));
}

TEST_F(RelayedPlanTest, PartialLayoutsStillRunOnTheWorkers) {
  CreateTensor("T", "S(0),R");
  StoreBuffers("T");
  ASSERT_TRUE(relay_.Redistribute("T", Target("P,R"), nullptr).ok());
  EXPECT_EQ(client_.calls("Execute"), 4);
  EXPECT_EQ(client_.calls("ReadChunk"), 0);
}

}  // namespace
}  // namespace shardcoord
