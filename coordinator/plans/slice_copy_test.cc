#include "coordinator/plans/slice_copy.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/testing/cluster_fixture.h"
#include "coordinator/testing/fake_worker_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

struct GroupOutcome {
  absl::Status status;
  GroupProgress progress;
};

class SliceCopyTest : public ClusterFixture {
 protected:
  SliceCopyTest() : slices_(&workers_, &tensors_, &client_) {
    RegisterWorkers(4);
    EXPECT_TRUE(meshes_.Create("M", {2, 2}, {}, {}).ok());
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
  }

  absl::StatusOr<StartedGroup> Start(const std::vector<SliceCopyMember>& members,
                                     std::optional<GroupOutcome>* out) {
    return slices_.Start(members, "copies", [out](const absl::Status& s, const GroupProgress& p) {
      *out = GroupOutcome{s, p};
    });
  }

  std::vector<float> Floats(int64_t rank, const std::string& tensor, int64_t version) {
    const std::string b = client_.Buffer(rank, tensor, version);
    std::vector<float> f(b.size() / 4);
    std::memcpy(f.data(), b.data(), f.size() * 4);
    return f;
  }

  // Every tensor is idle: a new holder can take it.
  void ExpectIdle(const std::string& name) {
    EXPECT_TRUE(tensors_.Acquire(name, "probe").ok()) << name;
    tensors_.Release(name, "probe");
  }

  SliceCopier slices_;
};

TEST_F(SliceCopyTest, ComposesEachDstRankFromThePiecesAndItsOldValues) {
  CreateFilled("q", "S(0),S(1)", "M", {4, 4});  // arange 0..15: rows 0-3 of qkv.
  CreateFilled("k", "R", "N", {2, 4});          // arange 0..7: rows 6-7; rows 4-5 keep 16..23.
  CreateFilled("qkv", "S(0)", "N", {8, 4});     // rank r holds rows 2r, 2r+1.
  const int64_t old_version = tensors_.Get("qkv")->version;
  std::optional<GroupOutcome> out;
  absl::StatusOr<StartedGroup> started =
      Start({{"q", "qkv", Shape{0, 0}, {}, {}}, {"k", "qkv", Shape{6, 0}, {}, {}}}, &out);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(out.has_value());
  ASSERT_TRUE(out->status.ok()) << out->status;
  EXPECT_EQ(out->progress.state, PlanState::kCommitted);
  const TensorRecord qkv = *tensors_.Get("qkv");
  EXPECT_EQ(qkv.version, started->members[0].target_version);
  EXPECT_EQ(qkv.version, started->members[1].target_version);
  EXPECT_GT(qkv.version, old_version);
  EXPECT_EQ(Floats(0, "qkv", qkv.version), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(Floats(1, "qkv", qkv.version), (std::vector<float>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(Floats(2, "qkv", qkv.version), (std::vector<float>{16, 17, 18, 19, 20, 21, 22, 23}));
  EXPECT_EQ(Floats(3, "qkv", qkv.version), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  // Checksums are the workers' own, per dst chunk; the old version is dropped everywhere.
  for (size_t r = 0; r < qkv.layout.ranks().size(); ++r) {
    const int64_t rank = qkv.layout.ranks()[r].rank;
    EXPECT_EQ(qkv.checksums[r],
              ChunkChecksums{FakeWorkerClient::Checksum(client_.Buffer(rank, "qkv", qkv.version))});
    EXPECT_FALSE(client_.HasBuffer(rank, "qkv", old_version));
  }
  for (const char* t : {"q", "k", "qkv"}) ExpectIdle(t);
}

TEST_F(SliceCopyTest, AFailedWriteChangesNothing) {
  CreateFilled("k", "R", "N", {2, 4});
  CreateFilled("qkv", "S(0)", "N", {8, 4});
  const TensorRecord before = *tensors_.Get("qkv");
  client_.Fail("WriteChunk", 2, absl::UnavailableError("injected"));
  std::optional<GroupOutcome> out;
  absl::StatusOr<StartedGroup> started = Start({{"k", "qkv", Shape{6, 0}, {}, {}}}, &out);
  ASSERT_TRUE(started.ok()) << started.status();
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status.code(), absl::StatusCode::kAborted) << out->status;
  EXPECT_THAT(std::string(out->status.message()), HasSubstr("injected"));
  EXPECT_EQ(out->progress.state, PlanState::kAborted);
  const TensorRecord after = *tensors_.Get("qkv");
  EXPECT_EQ(after.version, before.version);
  EXPECT_EQ(after.checksums, before.checksums);
  for (int64_t rank = 0; rank < 4; ++rank) {
    EXPECT_TRUE(client_.HasBuffer(rank, "qkv", before.version)) << rank;
    EXPECT_FALSE(client_.HasBuffer(rank, "qkv", started->members[0].target_version)) << rank;
  }
  for (const char* t : {"k", "qkv"}) ExpectIdle(t);
}

TEST_F(SliceCopyTest, RefusalsReleaseEverything) {
  CreateFilled("k", "R", "N", {2, 4});
  CreateFilled("qkv", "S(0)", "N", {8, 4});
  CreateFilled("big", "R", "N", {512, 1024});  // 2 MiB on every rank.
  std::optional<GroupOutcome> out;
  absl::StatusOr<StartedGroup> s = Start({{"k", "qkv", Shape{7, 0}, {}, {}}}, &out);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("copies[0].dst_offset: box [7:9, 0:4] is out of range"));
  // Busy: the second member's tensor is held by someone else.
  ASSERT_TRUE(tensors_.Acquire("qkv", "other").ok());
  s = Start({{"k", "qkv", Shape{6, 0}, {}, {}}}, &out);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kAborted) << s.status();
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("copies[0].dst"));
  tensors_.Release("qkv", "other");
  s = Start({{"k", "big", Shape{0, 0}, {}, {}}}, &out);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnimplemented) << s.status();
  s = Start({{"qkv", "k", {}, Shape{2, 0}, Shape{2, 4}}, {"k", "qkv", Shape{0, 0}, {}, {}}}, &out);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("copies[1].src: tensor 'k' is also"));
  EXPECT_FALSE(out.has_value());
  for (const char* t : {"k", "qkv", "big"}) ExpectIdle(t);
}

TEST_F(SliceCopyTest, ClosedRefusesNewOnesAndIsIdle) {
  CreateFilled("k", "R", "N", {2, 4});
  CreateFilled("qkv", "S(0)", "N", {8, 4});
  std::optional<GroupOutcome> out;
  ASSERT_TRUE(Start({{"k", "qkv", Shape{6, 0}, {}, {}}}, &out).ok());
  EXPECT_EQ(slices_.RunningCount(), 0);  // The fake answers inline: it ended already.
  slices_.Close("draining");
  absl::StatusOr<StartedGroup> s = Start({{"k", "qkv", Shape{4, 0}, {}, {}}}, &out);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kUnavailable) << s.status();
  EXPECT_TRUE(slices_.AwaitIdle(absl::InfinitePast()));
  ExpectIdle("qkv");
}

// The worker-side path (rank buffers over 1 MiB, with a plan manager) over fake workers that
// run every plan fragment but do not know ComposeBoxes: the step that composes fails, and then
// nothing is left: every tensor keeps its version and is idle, the hidden tensors' buffers and
// the dsts' new buffers are dropped.
class SliceComposeFailureTest : public ClusterFixture {
 protected:
  SliceComposeFailureTest()
      : plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, PlanManagerOptions()),
        slices_(&workers_, &tensors_, &client_, &plans_) {
    workers_.AddListener(&plans_);
    RegisterWorkers(4);
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
    AnswerEveryFragment(&plans_);
  }

  std::optional<GroupOutcome> Run(const std::vector<SliceCopyMember>& members) {
    std::optional<GroupOutcome> out;
    absl::StatusOr<StartedGroup> started =
        slices_.Start(members, "copies", [&out](const absl::Status& s, const GroupProgress& p) {
          out = GroupOutcome{s, p};
        });
    EXPECT_TRUE(started.ok()) << started.status();
    return out;
  }

  void ExpectIdle(const std::string& name) {
    EXPECT_TRUE(tensors_.Acquire(name, "probe").ok()) << name;
    tensors_.Release(name, "probe");
  }

  int Drops(const std::string& suffix, int64_t version) {
    int n = 0;
    for (const auto& [rank, drop] : client_.drops()) {
      if (absl::EndsWith(drop.tensor(), suffix) && drop.version() == version) ++n;
    }
    return n;
  }

  PlanManager plans_;
  SliceCopier slices_;
};

TEST_F(SliceComposeFailureTest, AFailedComposeChangesNothingAndDropsEverythingNew) {
  CreateFilled("k", "R", "N", {2, 1024});
  CreateFilled("big", "R", "N", {512, 1024});  // 2 MiB on every rank: over the relay's bound.
  const int64_t vbig = tensors_.Get("big")->version, vk = tensors_.Get("k")->version;
  // Into a box: k is staged on big's ranks, then composing big's new buffers fails.
  std::optional<GroupOutcome> out = Run({{"k", "big", Shape{8, 0}, {}, {}}});
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status.code(), absl::StatusCode::kAborted) << out->status;
  EXPECT_THAT(std::string(out->status.message()), HasSubstr("ComposeBoxes on "));
  EXPECT_EQ(out->progress.state, PlanState::kAborted);
  EXPECT_EQ(tensors_.Get("big")->version, vbig);
  EXPECT_EQ(plans_.RunningPlansCount(), 0u);
  EXPECT_EQ(slices_.RunningCount(), 0);
  for (const char* t : {"k", "big"}) ExpectIdle(t);
  EXPECT_EQ(Drops("/stage", -1), 4);  // The staging tensor, on each of big's ranks.
  int new_big = 0;
  for (const auto& [rank, drop] : client_.drops()) {
    if (drop.tensor() == "big" && drop.version() > vbig) ++new_big;
  }
  EXPECT_EQ(new_big, 4);  // Each rank's new buffer (none was made; dropping is harmless).

  // Out of a box: reading the box out of big on its ranks fails first.
  out = Run({{"big", "k", {}, Shape{4, 0}, Shape{2, 1024}}});
  ASSERT_TRUE(out.has_value());
  EXPECT_EQ(out->status.code(), absl::StatusCode::kAborted) << out->status;
  EXPECT_THAT(std::string(out->status.message()), HasSubstr("ComposeBoxes on "));
  EXPECT_THAT(std::string(out->status.message()), HasSubstr("copies[0].src: ComposeBoxes on "));
  EXPECT_EQ(tensors_.Get("k")->version, vk);
  for (const char* t : {"k", "big"}) ExpectIdle(t);
  EXPECT_EQ(Drops("/extract", -1), 4);  // Never registered: dropped by name where it ran.
  EXPECT_TRUE(tensors_.List().size() == 2u) << "no hidden tensor is left";
}

}  // namespace
}  // namespace shardcoord
