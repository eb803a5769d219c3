// A worker SIGKILLed in the middle of a large redistribute. The plan must end ABORTED within
// the heartbeat timeout with an error that names the dead rank, and the tensor must stay in
// its previous layout: readable (every value checked) when each chunk has a live replica,
// and saying exactly which chunks were lost when not. Each test starts its own cluster,
// since it kills one of its workers.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/cluster.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// Short, so that a dead worker is noticed quickly; the interval leaves room for several
// missed beats before the timeout.
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(2);
constexpr absl::Duration kHeartbeatInterval = absl::Milliseconds(200);
// Slack on top of the heartbeat timeout for the coordinator's check period and the abort
// round trips: the bound the test holds the abort to.
constexpr absl::Duration kAbortSlack = absl::Seconds(3);

// 256 MiB of f32: big enough that the plan is still moving data when the kill lands.
const Shape kBigShape = {8192, 8192};

ClusterOptions FaultClusterOptions() {
  ClusterOptions options;
  options.coordinator_flags = {
      absl::StrCat("--heartbeat-timeout=", absl::ToInt64Milliseconds(kHeartbeatTimeout), "ms"),
      absl::StrCat("--heartbeat-interval=", absl::ToInt64Milliseconds(kHeartbeatInterval), "ms")};
  return options;
}

struct KillOutcome {
  v1::PlanProgress last;
  absl::Duration kill_to_end;
  bool killed = false;
  std::vector<v1::PlanState> seen;
};

// Starts the move without waiting, follows it with WatchPlan and SIGKILLs worker
// `victim` as soon as the plan is moving data (bytes done, or past PENDING).
void MoveAndKill(Cluster& cluster, const v1::RedistributeRequest& move, int victim,
                 KillOutcome* outcome) {
  v1::RedistributeRequest request = move;
  request.set_wait(false);
  absl::StatusOr<v1::RedistributeResponse> started = cluster.client().Redistribute(request);
  ASSERT_TRUE(started.ok()) << started.status();
  const std::string plan_id = started->progress().plan_id();
  ASSERT_FALSE(plan_id.empty());
  absl::Time killed_at;
  auto maybe_kill = [&](const v1::PlanProgress& p) {
    outcome->seen.push_back(p.state());
    if (outcome->killed) return;
    const bool moving = p.bytes_done() > 0 || p.state() == v1::PREPARED;
    if (!moving) return;
    ASSERT_TRUE(cluster.KillWorker(victim).ok());
    killed_at = absl::Now();
    outcome->killed = true;
  };
  maybe_kill(started->progress());
  absl::StatusOr<v1::PlanProgress> last = cluster.client().WatchPlan(plan_id, maybe_kill);
  const absl::Time ended_at = absl::Now();
  ASSERT_TRUE(last.ok()) << last.status();
  outcome->last = *last;
  if (outcome->killed) outcome->kill_to_end = ended_at - killed_at;
}

std::string States(const std::vector<v1::PlanState>& states) {
  std::vector<std::string> names;
  for (v1::PlanState s : states) names.push_back(v1::PlanState_Name(s));
  return absl::StrJoin(names, ",");
}

// The abort contract shared by both tests.
void ExpectAbortNamingRank(const KillOutcome& outcome, const v1::WorkerInfo& dead) {
  ASSERT_TRUE(outcome.killed) << "the plan ended (" << v1::PlanState_Name(outcome.last.state())
                              << ", states seen " << States(outcome.seen)
                              << ") before it moved data: make the tensor bigger";
  EXPECT_EQ(outcome.last.state(), v1::ABORTED) << "states seen " << States(outcome.seen);
  std::fprintf(stderr, "plan aborted %s after the kill: %s\n",
               absl::FormatDuration(outcome.kill_to_end).c_str(), outcome.last.error().c_str());
  EXPECT_LE(outcome.kill_to_end, kHeartbeatTimeout + kAbortSlack);
  const bool names_rank =
      absl::StrContains(outcome.last.error(), absl::StrCat("rank ", dead.rank())) ||
      absl::StrContains(outcome.last.error(), dead.name());
  EXPECT_TRUE(names_rank) << "error '" << outcome.last.error() << "' names neither rank "
                          << dead.rank() << " nor worker " << dead.name();
}

TEST(FaultTest, ReplicatedTensorSurvivesAWorkerKilledMidPlan) {
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(FaultClusterOptions());
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  CoordinatorClient& client = cluster.client();
  ASSERT_TRUE(MakeMesh(client, "grid", {2, 2}, cluster.WorkerNames(), {"dp", "tp"}).ok());
  // S(0),R: w0 and w1 hold the top half, w2 and w3 the bottom half.
  absl::StatusOr<v1::TensorInfo> before =
      CreateFilled(client, "big", kBigShape, DType::kF32, "grid", "S(0),R");
  ASSERT_TRUE(before.ok()) << before.status();

  constexpr int kVictim = 1;
  KillOutcome outcome;
  ASSERT_NO_FATAL_FAILURE(
      MoveAndKill(cluster, RedistributeTo("big", "", "R,S(1)"), kVictim, &outcome));
  ASSERT_NO_FATAL_FAILURE(ExpectAbortNamingRank(outcome, cluster.worker_info(kVictim)));

  // Still in its previous layout, with every chunk on a live replica.
  ASSERT_TRUE(cluster.WaitForWorkers({"w1"}, v1::DEAD, kHeartbeatTimeout + kAbortSlack).ok());
  absl::StatusOr<v1::TensorInfo> after = client.GetTensor("big");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version(), before->version());
  EXPECT_EQ(after->spec(), before->spec());
  EXPECT_TRUE(after->busy_plan().empty()) << after->busy_plan();
  EXPECT_TRUE(after->lost_chunks().empty()) << absl::StrJoin(after->lost_chunks(), "; ");
  absl::Status same = SameChunks(after->layout(), before->layout());
  EXPECT_TRUE(same.ok()) << same;
  absl::Status values = DownloadAndCheck(client, "big", DType::kF32, kBigShape, FillKind::kArange);
  EXPECT_TRUE(values.ok()) << values;

  // And it can move on without the dead worker.
  ASSERT_TRUE(MakeMesh(client, "survivors", {3}, {"w0", "w2", "w3"}).ok());
  absl::StatusOr<v1::RedistributeResponse> moved =
      client.Redistribute(RedistributeTo("big", "survivors", "S(1)"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  EXPECT_EQ(moved->progress().state(), v1::COMMITTED) << moved->progress().error();
  values = DownloadAndCheck(client, "big", DType::kF32, kBigShape, FillKind::kArange);
  EXPECT_TRUE(values.ok()) << values;
}

TEST(FaultTest, UnreplicatedTensorSaysWhichChunksWereLost) {
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(FaultClusterOptions());
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  CoordinatorClient& client = cluster.client();
  absl::StatusOr<v1::MeshInfo> line = MakeMesh(client, "line", {4}, cluster.WorkerNames());
  ASSERT_TRUE(line.ok()) << line.status();
  absl::StatusOr<v1::TensorInfo> before =
      CreateFilled(client, "big", kBigShape, DType::kF32, "line", "S(0)");
  ASSERT_TRUE(before.ok()) << before.status();

  constexpr int kVictim = 2;
  const v1::WorkerInfo dead = cluster.worker_info(kVictim);
  // The rows only the victim holds: its S(0) chunk.
  std::string lost_box;
  for (const v1::RankChunks& r : before->layout().ranks()) {
    if (r.rank() != dead.rank()) continue;
    ASSERT_EQ(r.chunks_size(), 1);
    absl::StatusOr<Box> box = BoxFromProto(r.chunks(0).box(), "box");
    ASSERT_TRUE(box.ok());
    lost_box = box->ToString();
  }
  ASSERT_FALSE(lost_box.empty()) << "worker " << dead.name() << " holds no chunk";

  KillOutcome outcome;
  ASSERT_NO_FATAL_FAILURE(
      MoveAndKill(cluster, RedistributeTo("big", "", "S(1)"), kVictim, &outcome));
  ASSERT_NO_FATAL_FAILURE(ExpectAbortNamingRank(outcome, dead));

  ASSERT_TRUE(
      cluster.WaitForWorkers({dead.name()}, v1::DEAD, kHeartbeatTimeout + kAbortSlack).ok());
  absl::StatusOr<v1::TensorInfo> after = client.GetTensor("big");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->version(), before->version());
  EXPECT_TRUE(after->busy_plan().empty()) << after->busy_plan();
  ASSERT_EQ(after->lost_chunks_size(), 1) << absl::StrJoin(after->lost_chunks(), "; ");
  EXPECT_THAT(after->lost_chunks(0), HasSubstr(lost_box));

  std::string data;
  absl::Status download = client.Download("big", &data).status();
  EXPECT_EQ(download.code(), absl::StatusCode::kFailedPrecondition) << download;
  EXPECT_THAT(download.message(), HasSubstr(lost_box));
  absl::StatusOr<v1::RedistributeResponse> again =
      client.Redistribute(RedistributeTo("big", "", "R"));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  // The tensor can still be deleted, freeing what the live workers hold.
  EXPECT_TRUE(client.DeleteTensor("big").ok());
}

}  // namespace
}  // namespace shardcoord
