// Copies through real daemons: one tensor's values written into another of the same shape
// and dtype on another mesh or layout (weight sync). Each case fills src with arange (per
// rank for Partial sources) and dst with other values, copies, and checks every value of
// dst against arange, dst's layout and mesh unchanged with a new version, and src unchanged.

#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// Uneven under torch.chunk on every mesh used here (10 rows over 4: 3,3,3,1).
const Shape kShape = {10, 7};

using Endpoint = CopyEndpoint;

v1::CopyRequest CopyOf(const std::string& src, const std::string& dst) {
  v1::CopyRequest request;
  request.set_src(src);
  request.set_dst(dst);
  request.set_wait(true);
  return request;
}

class CopyTest : public MeshTest {
 protected:
  // src holds arange in `from`; dst holds random values (or zeros when Partial) in `to`;
  // then src is copied into dst and everything is checked.
  void CopyAndCheck(const std::string& name, const Endpoint& from, const Endpoint& to,
                    DType dtype = DType::kF32) {
    const std::string src = name + "_src", dst = name + "_dst";
    absl::StatusOr<v1::TensorInfo> src_before =
        CreateCopySource(client(), src, kShape, dtype, from);
    ASSERT_TRUE(src_before.ok()) << "create " << src << ": " << src_before.status();
    absl::StatusOr<v1::TensorInfo> dst_before =
        CreateCopyDestination(client(), dst, kShape, dtype, to);
    ASSERT_TRUE(dst_before.ok()) << "create " << dst << ": " << dst_before.status();
    // dst does not hold src's values before the copy.
    ASSERT_FALSE(DownloadAndCheck(client(), dst, dtype, kShape, FillKind::kArange).ok());

    absl::StatusOr<v1::CopyResponse> response = client().Copy(CopyOf(src, dst));
    ASSERT_TRUE(response.ok()) << "copy " << from.spec << " on " << from.mesh << " -> " << to.spec
                               << " on " << to.mesh << ": " << response.status();
    EXPECT_EQ(response->progress().state(), v1::COMMITTED) << response->progress().error();
    EXPECT_EQ(response->progress().tensor(), dst);
    EXPECT_FALSE(response->plan().id().empty());
    if (!HasPartial(from)) {
      EXPECT_EQ(response->plan().bytes_moved(), response->plan().lower_bound_bytes());
    }

    absl::StatusOr<v1::TensorInfo> dst_after = client().GetTensor(dst);
    ASSERT_TRUE(dst_after.ok()) << dst_after.status();
    EXPECT_EQ(dst_after->version(), response->dst_version());
    EXPECT_GT(dst_after->version(), dst_before->version());
    EXPECT_EQ(dst_after->mesh(), to.mesh);
    EXPECT_EQ(dst_after->spec(), dst_before->spec());
    EXPECT_TRUE(dst_after->busy_plan().empty()) << dst_after->busy_plan();
    EXPECT_TRUE(dst_after->lost_chunks().empty());
    absl::Status same = SameChunks(dst_after->layout(), dst_before->layout());
    EXPECT_TRUE(same.ok()) << "dst's layout changed: " << same;
    absl::Status values = DownloadAndCheck(client(), dst, dtype, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << "dst after " << from.spec << " -> " << to.spec << ": " << values;

    absl::StatusOr<v1::TensorInfo> src_after = client().GetTensor(src);
    ASSERT_TRUE(src_after.ok()) << src_after.status();
    EXPECT_EQ(src_after->version(), src_before->version());
    EXPECT_TRUE(src_after->busy_plan().empty()) << src_after->busy_plan();
    same = SameChunks(src_after->layout(), src_before->layout());
    EXPECT_TRUE(same.ok()) << "src's layout changed: " << same;
    values = DownloadAndCheck(client(), src, dtype, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << "src after the copy: " << values;

    EXPECT_TRUE(client().DeleteTensor(src).ok());
    EXPECT_TRUE(client().DeleteTensor(dst).ok());
  }
};

TEST_F(CopyTest, ShardedIntoReplicated) { CopyAndCheck("s0_r", {"line", "S(0)"}, {"line", "R"}); }

TEST_F(CopyTest, ReplicatedIntoSharded) {
  CopyAndCheck("r_s1", {"grid", "R,R"}, {"grid", "S(1),S(0)"});
}

TEST_F(CopyTest, AcrossMeshes) {
  CopyAndCheck("grid_rev", {"grid", "S(0),R"}, {"line_rev", "S(1)"});
  CopyAndCheck("line_pair", {"line", "S(1)"}, {"pair", "S(0)"});
  CopyAndCheck("pair_trio", {"pair", "R"}, {"trio", "S(0)"});
}

TEST_F(CopyTest, UnevenShards) {
  CopyAndCheck("uneven", {"line", "S(0,[1,3,2,4])"}, {"grid", "R,S(1)"});
  CopyAndCheck("uneven_dst", {"grid", "S(1),S(0)"}, {"line_rev", "S(0,[2,4,1,3])"});
}

TEST_F(CopyTest, FlatLayouts) {
  CopyAndCheck("flat_src", {"line", "0:7;7:70;;", true}, {"pair", "S(0)"});
  CopyAndCheck("flat_dst", {"grid", "S(0),S(1)"}, {"line", "0:35;35:40;40:70;", true});
}

TEST_F(CopyTest, PartialSource) {
  CopyAndCheck("psum_trio", {"grid", "P(sum),S(1)"}, {"trio", "R"});
  CopyAndCheck("psum_line", {"line", "P(sum)"}, {"grid", "S(0),S(1)"});
}

TEST_F(CopyTest, PartialTarget) {
  CopyAndCheck("into_psum", {"line", "S(0)"}, {"grid", "P(sum),S(1)"});
}

TEST_F(CopyTest, OtherDtypes) {
  CopyAndCheck("bf16", {"grid", "S(0),R"}, {"line_rev", "S(1)"}, DType::kBF16);
  CopyAndCheck("i64", {"line", "S(1)"}, {"trio", "R"}, DType::kI64);
}

TEST_F(CopyTest, RepeatedCopiesBumpOnlyDst) {
  // Weight sync: the same src into the same dst again; src keeps its version throughout.
  absl::StatusOr<v1::TensorInfo> src =
      CreateFilled(client(), "w_src", kShape, DType::kF32, "grid", "S(0),R");
  ASSERT_TRUE(src.ok()) << src.status();
  absl::StatusOr<v1::TensorInfo> dst =
      CreateFilled(client(), "w_dst", kShape, DType::kF32, "line", "S(1)", false, v1::ZEROS);
  ASSERT_TRUE(dst.ok()) << dst.status();
  int64_t last = dst->version();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<v1::CopyResponse> r = client().Copy(CopyOf("w_src", "w_dst"));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->dst_version(), last);
    last = r->dst_version();
    EXPECT_EQ(client().GetTensor("w_src")->version(), src->version());
  }
  EXPECT_EQ(client().GetTensor("w_dst")->version(), last);
  absl::Status values = DownloadAndCheck(client(), "w_dst", DType::kF32, kShape, FillKind::kArange);
  EXPECT_TRUE(values.ok()) << values;
  EXPECT_TRUE(client().DeleteTensor("w_src").ok());
  EXPECT_TRUE(client().DeleteTensor("w_dst").ok());
}

TEST_F(CopyTest, BadPairsAreRefusedAndChangeNothing) {
  ASSERT_TRUE(CreateFilled(client(), "b_a", kShape, DType::kF32, "line", "S(0)").ok());
  ASSERT_TRUE(CreateFilled(client(), "b_wide", {10, 8}, DType::kF32, "line", "S(0)").ok());
  ASSERT_TRUE(CreateFilled(client(), "b_long", kShape, DType::kI64, "line", "S(0)").ok());
  const int64_t version = client().GetTensor("b_a")->version();

  absl::StatusOr<v1::CopyResponse> r = client().Copy(CopyOf("b_a", "b_a"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  r = client().Copy(CopyOf("b_a", "b_wide"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("[10, 8]"));
  EXPECT_THAT(r.status().message(), HasSubstr("[10, 7]"));
  r = client().Copy(CopyOf("b_long", "b_a"));  // Integer to float: no cast.
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(),
              HasSubstr("dst: tensor 'b_a' dtype f32 cannot be cast from src 'b_long' dtype i64"));
  EXPECT_EQ(client().Copy(CopyOf("b_a", "b_none")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client().Copy(CopyOf("b_none", "b_a")).status().code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(client().GetTensor("b_a")->version(), version);
  EXPECT_TRUE(client().GetTensor("b_a")->busy_plan().empty());
  EXPECT_TRUE(DownloadAndCheck(client(), "b_a", DType::kF32, kShape, FillKind::kArange).ok());
  for (const char* name : {"b_a", "b_wide", "b_long"}) {
    EXPECT_TRUE(client().DeleteTensor(name).ok()) << name;
  }
}

}  // namespace
}  // namespace shardcoord
