// Groups through real daemons as fused plans (issue 10): every member of a group travels in
// one plan per worker, its transfers between two ranks in one bucketed stream. Checks every
// value of every member, versions, bytes moved against the lower bound, the fused exchange
// as the workers report it (one exchange per pair, its buckets), gathers of several
// tensors, and a worker SIGKILLed in the middle of a group.

#include <algorithm>
#include <map>
#include <memory>
#include <set>
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
#include "sharding/fill.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// Uneven under torch.chunk on every mesh used here (10 rows over 4: 3,3,3,1).
const Shape kShape = {10, 7};

void EnsureMeshes(CoordinatorClient& client) {
  absl::StatusOr<std::map<std::string, v1::MeshInfo>> meshes = MakeTestMeshes(client);
  ASSERT_TRUE(meshes.ok()) << meshes.status();
}

// The buckets each rank's exchange rounds report, checking that every rank sends to each
// peer in one round at most (one exchange per pair).
int64_t BucketsInTrace(const v1::PlanTrace& trace) {
  int64_t buckets = 0;
  for (const v1::RankTrace& r : trace.ranks()) {
    std::set<int64_t> peers;
    for (const v1::StepTiming& s : r.steps()) {
      EXPECT_EQ(s.op(), "fused_exchange") << "rank " << r.rank();
      if (s.send_peer() >= 0) {
        EXPECT_TRUE(peers.insert(s.send_peer()).second)
            << "rank " << r.rank() << " sent to " << s.send_peer() << " twice";
      }
      buckets += s.buckets_sent();
    }
  }
  return buckets;
}

class GroupTest : public ClusterTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(ClusterTest::SetUp());
    ASSERT_NO_FATAL_FAILURE(EnsureMeshes(client()));
  }
};

TEST_F(GroupTest, RedistributeGroupOfEveryLayoutKindChecksEveryValue) {
  struct Move {
    std::string name;
    std::string from_mesh, from;
    bool from_flat = false;
    std::string to_mesh, to;
    bool to_flat = false;
    DType dtype = DType::kF32;
  };
  const std::vector<Move> moves = {
      {"k_uneven", "line", "S(0,[1,3,2,4])", false, "grid", "R,S(1)"},
      {"k_to_flat", "grid", "S(0),S(1)", false, "line", "0:35;35:40;40:70;", true},
      {"k_from_flat", "line", "0:7;7:70;;", true, "line_rev", "S(0,[2,4,1,3])"},
      {"k_cross", "grid", "S(0),R", false, "trio", "S(1)"},
      {"k_bf16", "line", "S(1)", false, "trio", "R", false, DType::kBF16},
      {"k_f64", "trio", "R", false, "grid", "S(1),S(0)", false, DType::kF64},
  };
  v1::RedistributeGroupRequest request;
  request.set_wait(true);
  std::map<std::string, int64_t> before;
  for (const Move& m : moves) {
    absl::StatusOr<v1::TensorInfo> t =
        CreateFilled(client(), m.name, kShape, m.dtype, m.from_mesh, m.from, m.from_flat);
    ASSERT_TRUE(t.ok()) << m.name << ": " << t.status();
    before[m.name] = t->version();
    v1::RedistributeItem* item = request.add_redistributes();
    item->set_tensor(m.name);
    *item->mutable_target() = SpecFromText(m.to_mesh, m.to, m.to_flat);
  }
  absl::StatusOr<v1::RedistributeGroupResponse> r = client().RedistributeGroup(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  EXPECT_EQ(r->bytes_moved(), r->lower_bound_bytes());
  EXPECT_GT(r->bytes_moved(), 0);
  EXPECT_EQ(r->bucket_bytes(), int64_t{64} << 20);
  EXPECT_GT(r->buckets(), 0);
  ASSERT_EQ(r->members_size(), static_cast<int>(moves.size()));
  for (size_t i = 0; i < moves.size(); ++i) {
    const Move& m = moves[i];
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(m.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->version(), r->members(i).version()) << m.name;
    EXPECT_GT(t->version(), before[m.name]) << m.name;
    EXPECT_EQ(t->mesh(), m.to_mesh) << m.name;
    EXPECT_EQ(r->members(i).progress().state(), v1::COMMITTED) << m.name;
    absl::Status values = DownloadAndCheck(client(), m.name, m.dtype, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << m.name << ": " << values;
  }
  // The fused plan as the workers ran it: its buckets are the ones planned.
  absl::StatusOr<v1::PlanTrace> trace = client().GetPlanTrace(r->group_id());
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->op(), "group");
  EXPECT_EQ(trace->state(), v1::COMMITTED);
  EXPECT_EQ(BucketsInTrace(*trace), r->buckets());
  // A member's plan id still answers WatchPlan and GetPlanTrace.
  absl::StatusOr<v1::PlanProgress> watched =
      client().WatchPlan(r->members(0).progress().plan_id(), [](const v1::PlanProgress&) {});
  ASSERT_TRUE(watched.ok()) << watched.status();
  EXPECT_EQ(watched->state(), v1::COMMITTED);
  EXPECT_TRUE(client().GetPlanTrace(r->members(0).progress().plan_id()).ok());
  for (const Move& m : moves) EXPECT_TRUE(client().DeleteTensor(m.name).ok()) << m.name;
}

TEST_F(GroupTest, PartialMembersReduceInTheFusedStream) {
  struct Move {
    std::string name, from_mesh, from, to_mesh, to;
  };
  const std::vector<Move> moves = {
      {"p_sum_trio", "grid", "P(sum),S(1)", "trio", "R"},
      {"p_sum_line", "line", "P(sum)", "grid", "S(0),S(1)"},
      {"p_plain", "grid", "R,R", "line", "S(0)"},
  };
  v1::RedistributeGroupRequest request;
  request.set_wait(true);
  for (const Move& m : moves) {
    absl::StatusOr<v1::TensorInfo> t =
        CreatePartialArange(client(), m.name, kShape, DType::kF32, m.from_mesh, m.from);
    ASSERT_TRUE(t.ok()) << m.name << ": " << t.status();
    v1::RedistributeItem* item = request.add_redistributes();
    item->set_tensor(m.name);
    *item->mutable_target() = SpecFromText(m.to_mesh, m.to);
  }
  absl::StatusOr<v1::RedistributeGroupResponse> r = client().RedistributeGroup(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  for (const Move& m : moves) {
    absl::Status values =
        DownloadAndCheck(client(), m.name, DType::kF32, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << m.name << ": " << values;
    EXPECT_TRUE(client().DeleteTensor(m.name).ok()) << m.name;
  }
}

TEST_F(GroupTest, GatherGroupToOneRankThenToAMesh) {
  const std::vector<std::string> names = {"ga_a", "ga_b", "ga_c"};
  const std::vector<std::string> specs = {"S(0)", "S(1)", "S(0,[4,0,3,3])"};
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(CreateFilled(client(), names[i], kShape, DType::kF32, "line", specs[i]).ok());
  }
  v1::GatherGroupRequest request;
  for (const std::string& n : names) request.add_tensors(n);
  request.set_has_to_rank(true);
  request.set_to_rank(cluster_->worker_info(2).rank());
  request.set_wait(true);
  absl::StatusOr<v1::RedistributeGroupResponse> r = client().GatherGroup(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  EXPECT_EQ(r->bytes_moved(), r->lower_bound_bytes());
  ASSERT_EQ(r->members_size(), 3);
  for (size_t i = 0; i < names.size(); ++i) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(names[i]);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->version(), r->members(i).version());
    ASSERT_EQ(t->layout().ranks_size(), 1) << names[i];
    EXPECT_EQ(t->layout().ranks(0).rank(), cluster_->worker_info(2).rank());
    absl::Status values =
        DownloadAndCheck(client(), names[i], DType::kF32, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << names[i] << ": " << values;
  }
  // Back onto a mesh, replicated everywhere.
  request.set_has_to_rank(false);
  request.set_to_rank(0);
  request.set_mesh("grid");
  r = client().GatherGroup(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_moved(), r->lower_bound_bytes());
  for (const std::string& n : names) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(n);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->spec(), "R,R") << n;
    absl::Status values = DownloadAndCheck(client(), n, DType::kF32, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << n << ": " << values;
  }
  // A bad member refuses the group and changes nothing.
  std::map<std::string, int64_t> versions;
  for (const std::string& n : names) versions[n] = client().GetTensor(n)->version();
  v1::GatherGroupRequest bad = request;
  bad.add_tensors("ga_none");
  r = client().GatherGroup(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("tensors[3]: unknown tensor 'ga_none'"));
  bad = request;
  bad.add_tensors("ga_a");
  r = client().GatherGroup(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  for (const std::string& n : names) {
    EXPECT_EQ(client().GetTensor(n)->version(), versions[n]) << n;
    EXPECT_TRUE(client().DeleteTensor(n).ok()) << n;
  }
}

TEST_F(GroupTest, ManySmallTensorsGoAsOneBucketPerPair) {
  constexpr int kTensors = 200;
  const Shape shape = {8, 8};
  v1::CopyGroupRequest request;
  request.set_wait(true);
  for (int i = 0; i < kTensors; ++i) {
    const std::string src = absl::StrCat("small_", i), dst = absl::StrCat("small_", i, "_dst");
    ASSERT_TRUE(CreateFilled(client(), src, shape, DType::kF32, "line", "S(0)").ok()) << src;
    ASSERT_TRUE(
        CreateFilled(client(), dst, shape, DType::kF32, "line", "S(1)", false, v1::ZEROS).ok())
        << dst;
    v1::CopyPair* p = request.add_copies();
    p->set_src(src);
    p->set_dst(dst);
  }
  absl::StatusOr<v1::CopyGroupResponse> r = client().CopyGroup(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  EXPECT_EQ(r->bytes_moved(), r->lower_bound_bytes());
  // Every tensor sends a 2x2 block to each of the 12 ordered pairs: 200 blocks of 16 bytes
  // per pair, one bucket each.
  EXPECT_EQ(r->bytes_moved(), int64_t{kTensors} * 12 * 16);
  EXPECT_EQ(r->buckets(), 12);
  absl::StatusOr<v1::PlanTrace> trace = client().GetPlanTrace(r->group_id());
  ASSERT_TRUE(trace.ok()) << trace.status();
  ASSERT_EQ(trace->ranks_size(), 4);
  EXPECT_EQ(BucketsInTrace(*trace), 12);
  for (const v1::RankTrace& rank : trace->ranks()) {
    ASSERT_EQ(rank.steps_size(), 3) << "rank " << rank.rank();
    for (const v1::StepTiming& s : rank.steps()) {
      EXPECT_EQ(s.buckets_sent(), 1);
      EXPECT_EQ(s.buckets_received(), 1);
      EXPECT_EQ(s.bytes_sent(), kTensors * 16);
    }
  }
  for (int i = 0; i < kTensors; i += 37) {
    const std::string dst = absl::StrCat("small_", i, "_dst");
    absl::Status values = DownloadAndCheck(client(), dst, DType::kF32, shape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << dst << ": " << values;
  }
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_TRUE(client().DeleteTensor(absl::StrCat("small_", i)).ok());
    EXPECT_TRUE(client().DeleteTensor(absl::StrCat("small_", i, "_dst")).ok());
  }
}

// ---- A worker killed in the middle of a group (a cluster of its own) ---------------------

constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(2);
constexpr absl::Duration kHeartbeatInterval = absl::Milliseconds(200);
constexpr absl::Duration kAbortSlack = absl::Seconds(3);

TEST(GroupFaultTest, AWorkerKilledMidGroupLeavesEveryMemberAtItsOldVersion) {
  ClusterOptions options;
  options.coordinator_flags = {
      absl::StrCat("--heartbeat-timeout=", absl::ToInt64Milliseconds(kHeartbeatTimeout), "ms"),
      absl::StrCat("--heartbeat-interval=", absl::ToInt64Milliseconds(kHeartbeatInterval), "ms")};
  // Small buckets: many windows, so the group is still moving data when the kill lands.
  options.worker_flags = {"--bucket-bytes=1048576"};
  absl::StatusOr<std::unique_ptr<Cluster>> started = Cluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  CoordinatorClient& client = cluster.client();
  ASSERT_TRUE(MakeMesh(client, "grid", {2, 2}, cluster.WorkerNames(), {"dp", "tp"}).ok());
  ASSERT_TRUE(MakeMesh(client, "line", {4}, cluster.WorkerNames()).ok());
  // S(0),R: w0 and w1 hold the top half, w2 and w3 the bottom half (replicated); the S(1)
  // tensor has one copy of each column block, so w1's is lost with it.
  struct Member {
    std::string name;
    Shape shape;
    std::string mesh, from, to;
    bool replicated;
  };
  const std::vector<Member> members = {
      {"big_a", {8192, 4096}, "grid", "S(0),R", "R,S(1)", true},
      {"big_b", {8192, 4096}, "grid", "S(0),R", "S(1),S(0)", true},
      {"small_c", {64, 64}, "line", "S(1)", "S(0)", false},
  };
  std::map<std::string, v1::TensorInfo> before;
  v1::RedistributeGroupRequest request;
  for (const Member& m : members) {
    absl::StatusOr<v1::TensorInfo> t =
        CreateFilled(client, m.name, m.shape, DType::kF32, m.mesh, m.from);
    ASSERT_TRUE(t.ok()) << m.name << ": " << t.status();
    before[m.name] = *t;
    v1::RedistributeItem* item = request.add_redistributes();
    item->set_tensor(m.name);
    *item->mutable_target() = SpecFromText("", m.to);
  }
  request.set_wait(false);
  absl::StatusOr<v1::RedistributeGroupResponse> group = client.RedistributeGroup(request);
  ASSERT_TRUE(group.ok()) << group.status();
  ASSERT_EQ(group->members_size(), 3);
  constexpr int kVictim = 1;
  bool killed = false;
  absl::Time killed_at;
  // Kill once every worker runs the group's fragment.
  auto maybe_kill = [&](const v1::PlanProgress& p) {
    if (killed || (p.state() != v1::PREPARED && p.bytes_done() == 0)) return;
    ASSERT_TRUE(cluster.KillWorker(kVictim).ok());
    killed_at = absl::Now();
    killed = true;
  };
  maybe_kill(group->members(0).progress());
  absl::StatusOr<v1::PlanProgress> last =
      client.WatchPlan(group->members(0).progress().plan_id(), maybe_kill);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_TRUE(killed) << "the group ended (" << v1::PlanState_Name(last->state())
                      << ") before it moved data";
  EXPECT_EQ(last->state(), v1::ABORTED);
  EXPECT_LE(absl::Now() - killed_at, kHeartbeatTimeout + kAbortSlack);
  const v1::WorkerInfo& dead = cluster.worker_info(kVictim);
  EXPECT_TRUE(absl::StrContains(last->error(), absl::StrCat("rank ", dead.rank())) ||
              absl::StrContains(last->error(), dead.name()))
      << last->error();
  ASSERT_TRUE(cluster.WaitForWorkers({"w1"}, v1::DEAD, kHeartbeatTimeout + kAbortSlack).ok());

  // Every member ended ABORTED and kept its version and layout.
  for (int i = 0; i < group->members_size(); ++i) {
    absl::StatusOr<v1::PlanProgress> p =
        client.WatchPlan(group->members(i).progress().plan_id(), [](const v1::PlanProgress&) {});
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->state(), v1::ABORTED) << members[i].name;
  }
  for (const Member& m : members) {
    absl::StatusOr<v1::TensorInfo> after = client.GetTensor(m.name);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_EQ(after->version(), before[m.name].version()) << m.name;
    EXPECT_EQ(after->spec(), before[m.name].spec()) << m.name;
    EXPECT_TRUE(after->busy_plan().empty()) << m.name;
    absl::Status same = SameChunks(after->layout(), before[m.name].layout());
    EXPECT_TRUE(same.ok()) << m.name << ": " << same;
    if (m.replicated) {
      EXPECT_TRUE(after->lost_chunks().empty()) << absl::StrJoin(after->lost_chunks(), "; ");
      absl::Status values =
          DownloadAndCheck(client, m.name, DType::kF32, m.shape, FillKind::kArange);
      EXPECT_TRUE(values.ok()) << m.name << ": " << values;
    } else {
      EXPECT_FALSE(after->lost_chunks().empty()) << m.name;
    }
  }
  absl::StatusOr<v1::PlanTrace> trace = client.GetPlanTrace(group->group_id());
  ASSERT_TRUE(trace.ok()) << trace.status();
  EXPECT_EQ(trace->state(), v1::ABORTED);
}

}  // namespace
}  // namespace shardcoord
