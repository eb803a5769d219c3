// Attached tensors on the coordinator: which ranks have a lent buffer, what is refused, what a
// detach does to the plans that use the rank, and which plans keep a tensor attached.
#include "coordinator/cluster/attach_manager.h"

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

class AttachManagerTest : public ClusterFixture {
 protected:
  AttachManagerTest()
      : plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_),
        attach_(&workers_, &tensors_, &plans_) {
    workers_.AddListener(&plans_);
    RegisterWorkers(4);
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
  }

  // An 8x4 f32 tensor on N: attached (every rank waiting for a buffer), or the workers' own
  // (every rank held), version from the manager.
  void Create(const std::string& name, const std::string& placements, bool attached) {
    TensorRecord t;
    t.name = name;
    t.shape = {8, 4};
    t.mesh = "N";
    t.spec = placements;
    t.layout =
        *Layout::FromPlacements(meshes_.Get("N")->mesh, t.shape, *ParsePlacements(placements));
    t.version = tensors_.NewVersion();
    t.attached = attached;
    LayoutChecksums sums;
    absl::flat_hash_map<int64_t, int64_t> holders;
    for (const RankChunks& rc : t.layout.ranks()) {
      sums.emplace_back(rc.chunks.size(), 0);
      if (attached) {
        t.unattached.insert(rc.rank);
      } else {
        holders[rc.rank] = Incarnation(rc.rank);
      }
    }
    ASSERT_TRUE(tensors_.Reserve(t, "create").ok());
    ASSERT_TRUE(tensors_.FinishCreate(name, "create", sums, holders).ok());
  }

  AttachArgs Args(const std::string& tensor, int64_t rank) {
    const TensorRecord t = *tensors_.Get(tensor);
    AttachArgs a;
    a.worker = absl::StrCat("w", rank);
    a.incarnation = Incarnation(rank);
    a.tensor = tensor;
    a.version = t.version;
    a.rank = rank;
    a.dtype = t.dtype;
    a.chunks = *t.layout.Find(rank);
    a.memory = "shared";
    a.pid = 100 + rank;
    return a;
  }

  void AttachAll(const std::string& tensor) {
    for (int r = 0; r < 4; ++r) ASSERT_TRUE(attach_.Attach(Args(tensor, r)).ok()) << r;
  }

  // Every fragment of `plan_id` executed and reported its target chunks.
  void ReportAll(const std::string& plan_id) {
    ClusterFixture::ReportAll(&plans_, plan_id, [](const Chunk& c) { return c.box.offset(0) + 1; });
  }

  PlanManager plans_;
  AttachManager attach_;
};

TEST_F(AttachManagerTest, ReadableOnceEveryRankIsAttached) {
  Create("A", "S(0)", /*attached=*/true);
  for (int r = 0; r < 4; ++r) {
    absl::StatusOr<bool> readable = attach_.Attach(Args("A", r));
    ASSERT_TRUE(readable.ok()) << readable.status();
    EXPECT_EQ(*readable, r == 3);
  }
  const TensorRecord t = *tensors_.Get("A");
  EXPECT_TRUE(t.attached);
  EXPECT_TRUE(t.unattached.empty());
  EXPECT_TRUE(
      LostChunks(t, [this](int64_t r, int64_t i) { return workers_.IsLive(r, i); }).empty());
}

// A worker's death: the attached tensors whose rank it served (its other incarnations', and
// the workers' own tensors, are not named).
TEST_F(AttachManagerTest, AWorkerDeathNamesTheAttachedTensorsItServed) {
  Create("A", "S(0)", /*attached=*/true);
  Create("B", "S(0)", /*attached=*/true);
  Create("O", "S(0)", /*attached=*/false);
  AttachAll("A");
  ASSERT_TRUE(attach_.Attach(Args("B", 1)).ok());
  const WorkerRecord w1 = *workers_.GetByRank(1);
  EXPECT_THAT(attach_.OnWorkerLost(w1), ElementsAre("A", "B"));
  WorkerRecord older = w1;
  --older.incarnation;
  EXPECT_TRUE(attach_.OnWorkerLost(older).empty());
  EXPECT_THAT(attach_.OnWorkerLost(*workers_.GetByRank(2)), ElementsAre("A"));
}

TEST_F(AttachManagerTest, RefusalsNameTheFieldAndChangeNothing) {
  Create("A", "S(0)", /*attached=*/true);
  Create("own", "S(0)", /*attached=*/false);
  auto refused = [&](AttachArgs a, absl::StatusCode code, const std::string& text) {
    SCOPED_TRACE(text);
    absl::StatusOr<bool> got = attach_.Attach(a);
    EXPECT_EQ(got.status().code(), code) << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr(text));
    EXPECT_EQ(tensors_.Get("A")->unattached.size(), 4u);
  };
  AttachArgs other_rank = Args("A", 1);
  other_rank.worker = "w0";
  other_rank.incarnation = Incarnation(0);
  refused(other_rank, absl::StatusCode::kFailedPrecondition, "holds rank 0, not rank 1");
  AttachArgs dtype = Args("A", 0);
  dtype.dtype = DType::kF16;
  refused(dtype, absl::StatusCode::kInvalidArgument, "dtype: the buffer holds f16");
  AttachArgs chunks = Args("A", 0);
  chunks.chunks.local_elements += 1;
  refused(chunks, absl::StatusCode::kInvalidArgument, "chunks: rank 0");
  AttachArgs version = Args("A", 0);
  version.version += 7;
  refused(version, absl::StatusCode::kAborted, "look it up again");
  AttachArgs stale = Args("A", 0);
  stale.incarnation = 0;
  refused(stale, absl::StatusCode::kAborted, "");
  refused(Args("own", 0), absl::StatusCode::kFailedPrecondition, "is not attached");
  AttachArgs unknown = Args("A", 0);
  unknown.tensor = "nope";
  refused(unknown, absl::StatusCode::kNotFound, "nope");
  ASSERT_TRUE(attach_.Attach(Args("A", 0)).ok());
  absl::StatusOr<bool> twice = attach_.Attach(Args("A", 0));
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(), HasSubstr("attached already"));
}

TEST_F(AttachManagerTest, CopyIntoAnAttachedTensorWritesItInPlaceAndKeepsItAttached) {
  Create("src", "S(0)", /*attached=*/false);
  Create("dst", "S(1)", /*attached=*/true);
  ASSERT_TRUE(attach_.Attach(Args("dst", 0)).ok());
  // Written in place: every rank's buffer must be there.
  absl::StatusOr<StartedPlan> early = plans_.Copy("src", "dst", nullptr);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(early.status().message(), HasSubstr("ranks 1, 2, 3 has no buffer attached"));
  for (int r = 1; r < 4; ++r) ASSERT_TRUE(attach_.Attach(Args("dst", r)).ok());

  const int64_t lent_version = tensors_.Get("dst")->version;
  std::optional<absl::Status> done;
  absl::StatusOr<StartedPlan> copy =
      plans_.Copy("src", "dst", [&](const absl::Status& s, const PlanProgress&) { done = s; });
  ASSERT_TRUE(copy.ok()) << copy.status();
  for (const v1::PlanFragment& f : client_.fragments()) {
    if (f.target().chunks_size() > 0) EXPECT_EQ(f.attached_target_version(), lent_version);
  }
  ReportAll(copy->id);
  ASSERT_TRUE(done.has_value());
  EXPECT_TRUE(done->ok()) << *done;
  const TensorRecord after = *tensors_.Get("dst");
  EXPECT_TRUE(after.attached);
  EXPECT_EQ(after.version, copy->target_version);
}

TEST_F(AttachManagerTest, DetachAbortsThePlansUsingTheRankAndLosesItsChunks) {
  Create("src", "S(0)", /*attached=*/true);
  Create("dst", "S(1)", /*attached=*/true);
  AttachAll("src");
  AttachAll("dst");
  const int64_t dst_version = tensors_.Get("dst")->version;
  std::optional<absl::Status> done;
  absl::StatusOr<StartedPlan> copy =
      plans_.Copy("src", "dst", [&](const absl::Status& s, const PlanProgress&) { done = s; });
  ASSERT_TRUE(copy.ok()) << copy.status();

  // Detaching a rank of another tensor, or one not attached by that incarnation, changes
  // nothing.
  ASSERT_TRUE(attach_.Detach("w2", Incarnation(2), "nope", 2, "gone").ok());
  EXPECT_FALSE(done.has_value());

  ASSERT_TRUE(attach_.Detach("w3", Incarnation(3), "dst", 3, "process 103 exited").ok());
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code(), absl::StatusCode::kAborted);
  EXPECT_THAT(done->message(), HasSubstr("rank 3's buffer of 'dst' on worker w3 was detached: "
                                         "process 103 exited"));
  const TensorRecord dst = *tensors_.Get("dst");
  EXPECT_EQ(dst.version, dst_version);
  EXPECT_THAT(dst.unattached, ElementsAre(3));
  EXPECT_TRUE(tensors_.Get("src")->busy_plan.empty());  // The source is free again.

  // A read of a rank nobody holds fails naming it; attached again, it reads.
  ASSERT_TRUE(attach_.Detach("w1", Incarnation(1), "src", 1, "process 101 exited").ok());
  absl::StatusOr<StartedPlan> read = plans_.Gather("src", "", 0, nullptr);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("no buffer attached"));
  ASSERT_TRUE(attach_.Attach(Args("src", 1)).ok());
  EXPECT_TRUE(plans_.Gather("src", "", 0, nullptr).ok());
}

TEST_F(AttachManagerTest, RedistributeMovesItIntoWorkerOwnedBuffers) {
  Create("A", "S(0)", /*attached=*/true);
  AttachAll("A");
  std::optional<absl::Status> done;
  Spec target;
  target.placements = *ParsePlacements("R");
  absl::StatusOr<StartedPlan> moved = plans_.Redistribute(
      "A", target, [&](const absl::Status& s, const PlanProgress&) { done = s; });
  ASSERT_TRUE(moved.ok()) << moved.status();
  for (const v1::PlanFragment& f : client_.fragments()) EXPECT_EQ(f.attached_target_version(), 0);
  ReportAll(moved->id);
  ASSERT_TRUE(done.has_value() && done->ok());
  const TensorRecord t = *tensors_.Get("A");
  EXPECT_FALSE(t.attached);
  EXPECT_TRUE(t.unattached.empty());
  // No longer attached: a detach report of the old buffer changes nothing, and no attach.
  ASSERT_TRUE(attach_.Detach("w0", Incarnation(0), "A", 0, "late").ok());
  EXPECT_TRUE(LostChunks(*tensors_.Get("A"), [this](int64_t r, int64_t i) {
                return workers_.IsLive(r, i);
              }).empty());
  EXPECT_EQ(attach_.Attach(Args("A", 0)).status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace shardcoord
