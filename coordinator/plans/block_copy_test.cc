#include "coordinator/plans/block_copy.h"

#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "coordinator/testing/cluster_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

TensorRecord Rec(const std::string& name, DType dtype, Shape shape) {
  TensorRecord r;
  r.name = name;
  r.dtype = dtype;
  r.shape = std::move(shape);
  return r;
}

std::string Refusal(const BlockCopyArgs& args, const TensorRecord& src, const TensorRecord& dst,
                    const TensorRecord& scale) {
  absl::Status s = CheckBlockCopy(args, src, dst, scale);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  return std::string(s.message());
}

TEST(CheckBlockCopyTest, QuantizeAcceptsAndRefusesNamingFieldAndValues) {
  BlockCopyArgs q{"w", "q", "s", BlockSize{128, 128}, false};
  const TensorRecord src = Rec("w", DType::kBF16, {300, 260});
  const TensorRecord dst = Rec("q", DType::kF8E4M3, {300, 260});
  const TensorRecord scale = Rec("s", DType::kF32, {3, 3});
  EXPECT_TRUE(CheckBlockCopy(q, src, dst, scale).ok());
  EXPECT_THAT(Refusal(q, src, Rec("q", DType::kBF16, {300, 260}), scale),
              HasSubstr("dst: 'q' is bf16; quantize writes f8_e4m3"));
  EXPECT_THAT(Refusal(q, Rec("w", DType::kI32, {300, 260}), dst, scale),
              HasSubstr("src: 'w' is i32"));
  EXPECT_THAT(Refusal(q, Rec("w", DType::kF8E8M0, {300, 260}), dst, scale),
              HasSubstr("other than f8_e8m0"));
  EXPECT_THAT(Refusal(q, src, dst, Rec("s", DType::kF32, {3, 2})),
              HasSubstr("scale: 's' is f32 [3, 2]; quantize with block:128x128 of [300, 260] "
                        "needs f32 [3, 3]"));
  EXPECT_THAT(Refusal(q, src, dst, Rec("s", DType::kBF16, {3, 3})), HasSubstr("needs f32"));
  EXPECT_THAT(Refusal(q, src, Rec("q", DType::kF8E4M3, {300, 261}), scale),
              HasSubstr("dst: 'q' has shape [300, 261], src 'w' has [300, 260]"));
  EXPECT_THAT(Refusal(q, Rec("w", DType::kF32, {8}), Rec("q", DType::kF8E4M3, {8}), scale),
              HasSubstr("two dims"));
  BlockCopyArgs same = q;
  same.scale = "q";
  EXPECT_THAT(Refusal(same, src, dst, dst), HasSubstr("scale: 'q' is also dst"));
}

TEST(CheckBlockCopyTest, DequantizeChecksTheOtherWay) {
  BlockCopyArgs d{"q", "y", "s", BlockSize{4, 8}, true};
  const TensorRecord src = Rec("q", DType::kF8E4M3, {2, 9, 17});
  const TensorRecord scale = Rec("s", DType::kF32, {2, 3, 3});
  EXPECT_TRUE(CheckBlockCopy(d, src, Rec("y", DType::kF32, {2, 9, 17}), scale).ok());
  EXPECT_TRUE(CheckBlockCopy(d, src, Rec("y", DType::kBF16, {2, 9, 17}), scale).ok());
  EXPECT_THAT(
      Refusal(d, Rec("q", DType::kBF16, {2, 9, 17}), Rec("y", DType::kF32, {2, 9, 17}), scale),
      HasSubstr("src: 'q' is bf16; dequantize reads f8_e4m3"));
  EXPECT_THAT(Refusal(d, src, Rec("y", DType::kI8, {2, 9, 17}), scale),
              HasSubstr("dst: 'y' is i8"));
}

// Over the plan manager with fake workers that run every fragment correctly but do not know
// BlockQuantize: staging commits, the compute step fails, and then nothing is left: dst and
// the scale keep their versions, every tensor is idle, the hidden tensors' buffers are dropped.
class BlockCopyFailureTest : public ClusterFixture {
 protected:
  BlockCopyFailureTest()
      : plans_(&clock_, &timer_, &workers_, &meshes_, &tensors_, &client_, PlanManagerOptions()),
        copies_(&clock_, &tensors_, &plans_, &workers_, &client_) {
    workers_.AddListener(&plans_);
    RegisterWorkers(4);
    EXPECT_TRUE(meshes_.Create("N", {4}, {}, {}).ok());
    AnswerEveryFragment(&plans_);
  }

  PlanManager plans_;
  BlockCopy copies_;
};

TEST_F(BlockCopyFailureTest, AFailedStepChangesNothingAndDropsTheHiddenTensors) {
  // 8 rows on 4 ranks (2 each): 4-row blocks are cut.
  CreateTestTensor(workers_, meshes_, &tensors_, "w", "S(0)", "N", {8, 8});
  CreateTestTensor(workers_, meshes_, &tensors_, "q", "S(1)", "N", {8, 8}, DType::kF8E4M3);
  CreateTestTensor(workers_, meshes_, &tensors_, "s", "R", "N", {2, 2});
  const int64_t vq = tensors_.Get("q")->version, vs = tensors_.Get("s")->version;
  std::optional<absl::Status> done;
  absl::Status started =
      copies_.Start(BlockCopyArgs{"w", "q", "s", BlockSize{4, 4}, false},
                    [&](absl::StatusOr<BlockCopyResult> r) { done = r.status(); });
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(done.has_value());
  EXPECT_EQ(done->code(), absl::StatusCode::kUnimplemented) << *done;
  EXPECT_THAT(std::string(done->message()), HasSubstr("BlockQuantize on "));
  EXPECT_EQ(tensors_.Get("q")->version, vq);
  EXPECT_EQ(tensors_.Get("s")->version, vs);
  EXPECT_EQ(plans_.RunningPlansCount(), 0u);
  for (const char* t : {"w", "q", "s"}) {
    absl::StatusOr<TensorRecord> held = tensors_.Acquire(t, "check");
    EXPECT_TRUE(held.ok()) << t << ": " << held.status();
    tensors_.Release(t, "check");
  }
  // The staged tensor's buffers (every version) go on each of its ranks.
  int staged_drops = 0;
  for (const auto& [rank, drop] : client_.drops()) {
    if (absl::EndsWith(drop.tensor(), "/stage") && drop.version() == -1) ++staged_drops;
  }
  EXPECT_EQ(staged_drops, 4);

  // A refusal before anything starts never calls `done`.
  done.reset();
  absl::Status refused =
      copies_.Start(BlockCopyArgs{"w", "q", "missing", BlockSize{4, 4}, false},
                    [&](absl::StatusOr<BlockCopyResult> r) { done = r.status(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(done.has_value());
}

TEST_F(BlockCopyFailureTest, AFailedGroupKeepsItsPlainMembersToo) {
  // 16 rows on 4 ranks (4 each): every 4x4 block is whole where it is, so w is read in place
  // (held busy) instead of staged.
  CreateTestTensor(workers_, meshes_, &tensors_, "w", "S(0)", "N", {16, 8});
  CreateTestTensor(workers_, meshes_, &tensors_, "q", "S(1)", "N", {16, 8}, DType::kF8E4M3);
  CreateTestTensor(workers_, meshes_, &tensors_, "s", "R", "N", {4, 2});
  CreateTestTensor(workers_, meshes_, &tensors_, "a", "S(0)", "N", {8});
  CreateTestTensor(workers_, meshes_, &tensors_, "b", "R", "N", {8}, DType::kBF16);
  const int64_t vq = tensors_.Get("q")->version, vb = tensors_.Get("b")->version;
  std::optional<absl::Status> done;
  const std::vector<BlockCopyArgs> group = {BlockCopyArgs{"a", "b", "", {}, false},
                                            BlockCopyArgs{"w", "q", "s", BlockSize{4, 4}, false}};
  absl::Status started =
      copies_.StartGroup(group, [&](absl::StatusOr<BlockGroupResult> r) { done = r.status(); });
  ASSERT_TRUE(started.ok()) << started;
  ASSERT_TRUE(done.has_value());
  EXPECT_THAT(std::string(done->message()), HasSubstr("copies[1].BlockQuantize on "));
  EXPECT_EQ(tensors_.Get("q")->version, vq);
  EXPECT_EQ(tensors_.Get("b")->version, vb);
  EXPECT_EQ(plans_.RunningPlansCount(), 0u);
  // Nothing was staged for w, and it is no longer held.
  for (const auto& [rank, drop] : client_.drops()) {
    EXPECT_FALSE(absl::EndsWith(drop.tensor(), "/stage")) << drop.tensor();
  }
  for (const char* t : {"w", "q", "s", "a", "b"}) {
    absl::StatusOr<TensorRecord> held = tensors_.Acquire(t, "check");
    EXPECT_TRUE(held.ok()) << t << ": " << held.status();
    tensors_.Release(t, "check");
  }
  // A source busy with another holder refuses the group before anything starts.
  ASSERT_TRUE(tensors_.Acquire("w", "other").ok());
  absl::Status busy = copies_.StartGroup(group, [](absl::StatusOr<BlockGroupResult>) {});
  EXPECT_EQ(busy.code(), absl::StatusCode::kAborted) << busy;
  EXPECT_THAT(std::string(busy.message()), HasSubstr("copies[1]."));
  tensors_.Release("w", "other");

  // Refusals name the member: a plain pair of other shapes, a scale named twice.
  std::vector<BlockCopyArgs> bad = group;
  bad[0].src = "w";
  bad[1].src = "a";
  absl::Status refused = copies_.StartGroup(bad, [](absl::StatusOr<BlockGroupResult>) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("copies[0].dst: "));
  bad = group;
  bad[1].scale = "b";
  refused = copies_.StartGroup(bad, [](absl::StatusOr<BlockGroupResult>) {});
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("copies[1].scale: tensor 'b' is also copies[0].dst"));
}

}  // namespace
}  // namespace shardcoord
