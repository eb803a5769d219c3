// CopyGroup through real daemons: many copies as one transaction. Each group fills its srcs
// with arange (per rank for Partial sources) and its dsts with other values, copies, and
// checks every value of every dst, that all dsts got their new versions together and every src
// kept its own; refused groups (a bad member, a busy member) change nothing.

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/box.h"
#include "sharding/fill.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

// Uneven under torch.chunk on every mesh used here (10 rows over 4: 3,3,3,1).
const Shape kShape = {10, 7};

using Endpoint = CopyEndpoint;

struct Member {
  std::string name;
  Endpoint from;
  Endpoint to;
  DType dtype = DType::kF32;
};

v1::CopyGroupRequest GroupOf(const std::vector<std::pair<std::string, std::string>>& pairs) {
  v1::CopyGroupRequest request;
  for (const auto& [src, dst] : pairs) {
    v1::CopyPair* p = request.add_copies();
    p->set_src(src);
    p->set_dst(dst);
  }
  request.set_wait(true);
  return request;
}

class CopyGroupTest : public MeshTest {
 protected:
  // Creates every member's src (arange) and dst (random, or zeros when Partial), runs the
  // group, and checks every value, version and layout.
  void CopyGroupAndCheck(const std::vector<Member>& members) {
    std::vector<std::pair<std::string, std::string>> pairs;
    absl::flat_hash_map<std::string, v1::TensorInfo> before;
    bool partial_source = false;
    for (const Member& m : members) {
      const std::string src = m.name + "_src", dst = m.name + "_dst";
      absl::StatusOr<v1::TensorInfo> s = CreateCopySource(client(), src, kShape, m.dtype, m.from);
      ASSERT_TRUE(s.ok()) << "create " << src << ": " << s.status();
      absl::StatusOr<v1::TensorInfo> d =
          CreateCopyDestination(client(), dst, kShape, m.dtype, m.to);
      ASSERT_TRUE(d.ok()) << "create " << dst << ": " << d.status();
      ASSERT_FALSE(DownloadAndCheck(client(), dst, m.dtype, kShape, FillKind::kArange).ok());
      before[src] = *s;
      before[dst] = *d;
      pairs.emplace_back(src, dst);
      partial_source = partial_source || HasPartial(m.from);
    }

    absl::StatusOr<v1::CopyGroupResponse> r = client().CopyGroup(GroupOf(pairs));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->group_id().empty());
    EXPECT_EQ(r->state(), v1::COMMITTED);
    ASSERT_EQ(r->members_size(), static_cast<int>(members.size()));
    int64_t moved = 0, lower = 0;
    for (const v1::CopyGroupMember& m : r->members()) {
      moved += m.plan().bytes_moved();
      lower += m.plan().lower_bound_bytes();
      EXPECT_EQ(m.progress().state(), v1::COMMITTED) << m.dst() << ": " << m.progress().error();
    }
    EXPECT_EQ(r->bytes_moved(), moved);
    EXPECT_EQ(r->lower_bound_bytes(), lower);
    if (!partial_source) EXPECT_EQ(r->bytes_moved(), r->lower_bound_bytes());

    for (size_t i = 0; i < members.size(); ++i) {
      const Member& m = members[i];
      const auto& [src, dst] = pairs[i];
      EXPECT_EQ(r->members(i).src(), src);
      EXPECT_EQ(r->members(i).dst(), dst);
      absl::StatusOr<v1::TensorInfo> dst_after = client().GetTensor(dst);
      ASSERT_TRUE(dst_after.ok()) << dst_after.status();
      EXPECT_EQ(dst_after->version(), r->members(i).dst_version()) << dst;
      EXPECT_GT(dst_after->version(), before[dst].version()) << dst;
      EXPECT_EQ(dst_after->mesh(), m.to.mesh);
      EXPECT_EQ(dst_after->spec(), before[dst].spec());
      EXPECT_TRUE(dst_after->busy_plan().empty()) << dst_after->busy_plan();
      absl::Status same = SameChunks(dst_after->layout(), before[dst].layout());
      EXPECT_TRUE(same.ok()) << dst << "'s layout changed: " << same;
      absl::Status values = DownloadAndCheck(client(), dst, m.dtype, kShape, FillKind::kArange);
      EXPECT_TRUE(values.ok()) << dst << " (" << m.from.spec << " on " << m.from.mesh << " -> "
                               << m.to.spec << " on " << m.to.mesh << "): " << values;

      absl::StatusOr<v1::TensorInfo> src_after = client().GetTensor(src);
      ASSERT_TRUE(src_after.ok()) << src_after.status();
      EXPECT_EQ(src_after->version(), before[src].version()) << src;
      EXPECT_TRUE(src_after->busy_plan().empty()) << src_after->busy_plan();
      values = DownloadAndCheck(client(), src, m.dtype, kShape, FillKind::kArange);
      EXPECT_TRUE(values.ok()) << src << " after the group: " << values;
    }
    for (const auto& [src, dst] : pairs) {
      EXPECT_TRUE(client().DeleteTensor(src).ok()) << src;
      EXPECT_TRUE(client().DeleteTensor(dst).ok()) << dst;
    }
  }
};

TEST_F(CopyGroupTest, EveryLayoutKindInOneGroupMovesTheLowerBound) {
  CopyGroupAndCheck({
      {"g_uneven", {"line", "S(0,[1,3,2,4])"}, {"grid", "R,S(1)"}},
      {"g_uneven_dst", {"grid", "S(1),S(0)"}, {"line_rev", "S(0,[2,4,1,3])"}},
      {"g_flat_src", {"line", "0:7;7:70;;", true}, {"pair", "S(0)"}},
      {"g_flat_dst", {"grid", "S(0),S(1)"}, {"line", "0:35;35:40;40:70;", true}},
      {"g_cross", {"grid", "S(0),R"}, {"line_rev", "S(1)"}},
      {"g_trio", {"pair", "R"}, {"trio", "S(0)"}},
      {"g_bf16", {"line", "S(1)"}, {"trio", "R"}, DType::kBF16},
  });
}

TEST_F(CopyGroupTest, PartialSourcesAndTargetsInOneGroup) {
  CopyGroupAndCheck({
      {"gp_psum_trio", {"grid", "P(sum),S(1)"}, {"trio", "R"}},
      {"gp_psum_line", {"line", "P(sum)"}, {"grid", "S(0),S(1)"}},
      {"gp_into_psum", {"line", "S(0)"}, {"grid", "P(sum),S(1)"}},
      {"gp_plain", {"grid", "R,R"}, {"line", "S(0)"}},
  });
}

TEST_F(CopyGroupTest, ABadMemberRefusesTheGroupAndChangesNothing) {
  ASSERT_TRUE(CreateFilled(client(), "bad_a", kShape, DType::kF32, "line", "S(0)").ok());
  ASSERT_TRUE(
      CreateFilled(client(), "bad_a_dst", kShape, DType::kF32, "grid", "R,S(1)", false, v1::RANDOM)
          .ok());
  ASSERT_TRUE(CreateFilled(client(), "bad_b", kShape, DType::kF32, "line", "S(1)").ok());
  ASSERT_TRUE(CreateFilled(client(), "bad_wide", {10, 8}, DType::kF32, "line", "S(0)").ok());
  ASSERT_TRUE(CreateFilled(client(), "bad_long", kShape, DType::kI64, "line", "S(0)").ok());
  const std::vector<std::string> names = {"bad_a", "bad_a_dst", "bad_b", "bad_wide", "bad_long"};
  absl::flat_hash_map<std::string, int64_t> versions;
  for (const std::string& n : names) versions[n] = Version(n);

  struct Case {
    std::vector<std::pair<std::string, std::string>> pairs;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"bad_a", "bad_a_dst"}, {"bad_b", "bad_wide"}},
       absl::StatusCode::kInvalidArgument,
       "copies[1].dst: tensor 'bad_wide' has shape [10, 8] but src 'bad_b' has shape [10, 7]"},
      {{{"bad_a", "bad_a_dst"}, {"bad_long", "bad_b"}},
       absl::StatusCode::kInvalidArgument,
       "copies[1].dst: tensor 'bad_b' dtype f32 cannot be cast from src 'bad_long' dtype i64"},
      {{{"bad_a", "bad_a_dst"}, {"bad_none", "bad_b"}},
       absl::StatusCode::kNotFound,
       "copies[1].src: unknown tensor 'bad_none'"},
      {{{"bad_a", "bad_a_dst"}, {"bad_b", "bad_a_dst"}},
       absl::StatusCode::kInvalidArgument,
       "copies[1].dst: tensor 'bad_a_dst' is also copies[0].dst"},
      {{{"bad_a", "bad_a"}}, absl::StatusCode::kInvalidArgument, "copies[0].dst"},
      {{}, absl::StatusCode::kInvalidArgument, "copies: empty group"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<v1::CopyGroupResponse> r = client().CopyGroup(GroupOf(c.pairs));
    EXPECT_EQ(r.status().code(), c.code) << c.message << ": " << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
  for (const std::string& n : names) {
    EXPECT_EQ(Version(n), versions[n]) << n;
    EXPECT_TRUE(client().GetTensor(n)->busy_plan().empty()) << n;
  }
  absl::Status values =
      DownloadAndCheck(client(), "bad_a_dst", DType::kF32, kShape, FillKind::kRandom);
  EXPECT_TRUE(values.ok()) << "bad_a_dst after the refused groups: " << values;
  for (const std::string& n : names) EXPECT_TRUE(client().DeleteTensor(n).ok()) << n;
}

TEST_F(CopyGroupTest, AGroupWithABusyDstIsAbortedAndChangesNothing) {
  ASSERT_TRUE(CreateFilled(client(), "busy_a", kShape, DType::kF32, "grid", "S(0),R").ok());
  ASSERT_TRUE(
      CreateFilled(client(), "busy_a_dst", kShape, DType::kF32, "line", "S(1)", false, v1::RANDOM)
          .ok());
  ASSERT_TRUE(CreateFilled(client(), "busy_b", kShape, DType::kF32, "line", "S(0)").ok());
  ASSERT_TRUE(
      CreateFilled(client(), "busy_b_dst", kShape, DType::kF32, "trio", "R", false, v1::RANDOM)
          .ok());
  const std::vector<std::string> names = {"busy_a", "busy_a_dst", "busy_b", "busy_b_dst"};
  absl::flat_hash_map<std::string, int64_t> versions;
  for (const std::string& n : names) versions[n] = Version(n);

  // An upload into busy_b_dst holds it busy while its stream is open; inside the stream the
  // group is tried, then the upload is cancelled (busy_b_dst keeps its version).
  const Box whole = Box::Whole(kShape);
  std::string data(static_cast<size_t>(whole.Volume() * 4), '\0');
  v1::TensorHeader header;
  header.set_name("busy_b_dst");
  for (int64_t d : kShape) header.add_shape(d);
  header.set_dtype(DTypeToProto(DType::kF32));
  header.set_total_bytes(static_cast<int64_t>(data.size()));
  bool tried = false;
  absl::StatusOr<v1::TensorInfo> up =
      client().UploadFrom(header, [&](size_t, std::string*) -> absl::Status {
        // The header is on its way: wait until the coordinator holds the tensor.
        std::string holder;
        while (holder.empty()) {
          absl::StatusOr<v1::TensorInfo> t = client().GetTensor("busy_b_dst");
          if (!t.ok()) return t.status();
          holder = t->busy_plan();
        }
        absl::StatusOr<v1::CopyGroupResponse> r =
            client().CopyGroup(GroupOf({{"busy_a", "busy_a_dst"}, {"busy_b", "busy_b_dst"}}));
        EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
        EXPECT_THAT(std::string(r.status().message()),
                    HasSubstr("copies[1]: tensor 'busy_b_dst' is busy with " + holder));
        for (const char* n : {"busy_a", "busy_a_dst", "busy_b"}) {
          EXPECT_TRUE(client().GetTensor(n)->busy_plan().empty()) << n;
        }
        tried = true;
        return absl::CancelledError("test: the group was tried");
      });
  ASSERT_TRUE(tried);
  EXPECT_FALSE(up.ok());
  for (const std::string& n : names) {
    EXPECT_EQ(Version(n), versions[n]) << n;
    EXPECT_TRUE(client().GetTensor(n)->busy_plan().empty()) << n;
  }
  for (const std::string& n : {"busy_a_dst", "busy_b_dst"}) {
    absl::Status values = DownloadAndCheck(client(), n, DType::kF32, kShape, FillKind::kRandom);
    EXPECT_TRUE(values.ok()) << n << " after the refused group: " << values;
  }
  // Once free, the same group commits both.
  absl::StatusOr<v1::CopyGroupResponse> r =
      client().CopyGroup(GroupOf({{"busy_a", "busy_a_dst"}, {"busy_b", "busy_b_dst"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  for (const std::string& n : {"busy_a_dst", "busy_b_dst"}) {
    absl::Status values = DownloadAndCheck(client(), n, DType::kF32, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << n << " after the group: " << values;
  }
  for (const std::string& n : names) EXPECT_TRUE(client().DeleteTensor(n).ok()) << n;
}

TEST_F(CopyGroupTest, RedistributeGroupMovesEveryTensorTogether) {
  struct Move {
    std::string name;
    Endpoint from;
    Endpoint to;
  };
  const std::vector<Move> moves = {
      {"rg_uneven", {"line", "S(0,[1,3,2,4])"}, {"grid", "R,S(1)"}},
      {"rg_flat", {"grid", "S(0),S(1)"}, {"line", "0:35;35:40;40:70;", true}},
      {"rg_cross", {"grid", "S(0),R"}, {"trio", "S(1)"}},
  };
  v1::RedistributeGroupRequest request;
  request.set_wait(true);
  absl::flat_hash_map<std::string, int64_t> before;
  for (const Move& m : moves) {
    absl::StatusOr<v1::TensorInfo> t =
        CreateFilled(client(), m.name, kShape, DType::kF32, m.from.mesh, m.from.spec, m.from.flat);
    ASSERT_TRUE(t.ok()) << m.name << ": " << t.status();
    before[m.name] = t->version();
    v1::RedistributeItem* item = request.add_redistributes();
    item->set_tensor(m.name);
    *item->mutable_target() = SpecFromText(m.to.mesh, m.to.spec, m.to.flat);
  }
  // A bad member (a spec that does not fit its mesh) refuses the whole group.
  v1::RedistributeGroupRequest bad = request;
  *bad.mutable_redistributes(2)->mutable_target() = SpecFromText("trio", "S(0),S(1)");
  absl::StatusOr<v1::RedistributeGroupResponse> r = client().RedistributeGroup(bad);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("redistributes[2].target"));
  for (const Move& m : moves) {
    EXPECT_EQ(Version(m.name), before[m.name]) << m.name;
    EXPECT_TRUE(client().GetTensor(m.name)->busy_plan().empty()) << m.name;
  }

  r = client().RedistributeGroup(request);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  EXPECT_EQ(r->bytes_moved(), r->lower_bound_bytes());
  ASSERT_EQ(r->members_size(), static_cast<int>(moves.size()));
  for (size_t i = 0; i < moves.size(); ++i) {
    const Move& m = moves[i];
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(m.name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->version(), r->members(i).version()) << m.name;
    EXPECT_GT(t->version(), before[m.name]) << m.name;
    EXPECT_EQ(t->mesh(), m.to.mesh) << m.name;
    EXPECT_EQ(r->members(i).progress().state(), v1::COMMITTED) << m.name;
    absl::Status values =
        DownloadAndCheck(client(), m.name, DType::kF32, kShape, FillKind::kArange);
    EXPECT_TRUE(values.ok()) << m.name << ": " << values;
    EXPECT_TRUE(client().DeleteTensor(m.name).ok()) << m.name;
  }
}

}  // namespace
}  // namespace shardcoord
