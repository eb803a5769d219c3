// Slices of fused tensors through real daemons (issue 28 item 4): q, k and v into one fused
// qkv and 8 experts into one stacked tensor with dst_offset (CopyGroup and Copy), the reverse
// with src_offset/src_shape, and refusals. Every test downloads the srcs and the dst before,
// composes the expected dst itself (sharding/cast.h's CastBox) and compares every byte after:
// the boxes hold the srcs' values (cast to dst's dtype), the rest of dst its old values.

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/box.h"
#include "sharding/cast.h"
#include "tests/cluster.h"
#include "tests/cluster_environment.h"
#include "tests/tensor_check.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

struct Piece {
  std::string src;
  Shape dst_offset;  // Empty: none.
  Shape src_offset;  // Empty: none.
  Shape src_shape;
};

v1::CopyGroupRequest GroupOf(const std::string& dst, const std::vector<Piece>& pieces) {
  v1::CopyGroupRequest request;
  for (const Piece& p : pieces) {
    v1::CopyPair* pair = request.add_copies();
    pair->set_src(p.src);
    pair->set_dst(dst);
    for (int64_t d : p.dst_offset) pair->add_dst_offset(d);
    for (int64_t d : p.src_offset) pair->add_src_offset(d);
    for (int64_t d : p.src_shape) pair->add_src_shape(d);
  }
  request.set_wait(true);
  return request;
}

class FusedCopyTest : public MeshTest {
 protected:
  struct Held {
    v1::TensorInfo info;
    std::string data;
  };
  Held Get(const std::string& name) {
    Held h;
    absl::StatusOr<v1::TensorInfo> info = client().GetTensor(name);
    EXPECT_TRUE(info.ok()) << name << ": " << info.status();
    if (info.ok()) h.info = *info;
    absl::StatusOr<v1::TensorHeader> header = client().Download(name, &h.data);
    EXPECT_TRUE(header.ok()) << name << ": " << header.status();
    return h;
  }
  void Create(const std::string& name, const Shape& shape, DType dtype, const std::string& mesh,
              const std::string& spec, v1::InitKind init) {
    absl::StatusOr<v1::TensorInfo> t =
        CreateFilled(client(), name, shape, dtype, mesh, spec, false, init);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
  }

  // Runs `request` (every member into `dst` of `dst_shape`, `dst_dtype`), then checks dst's
  // every byte against the srcs' values in their boxes and dst's old values elsewhere, that dst
  // got one new version and keeps its layout, and that every src kept its version.
  void CopyAndCheck(const std::string& dst, const Shape& dst_shape, DType dst_dtype,
                    const std::vector<Piece>& pieces) {
    Held before = Get(dst);
    std::map<std::string, Held> srcs;
    for (const Piece& p : pieces) srcs.emplace(p.src, Get(p.src));
    absl::StatusOr<v1::CopyGroupResponse> r = client().CopyGroup(GroupOf(dst, pieces));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->state(), v1::COMMITTED);
    ASSERT_EQ(r->members_size(), static_cast<int>(pieces.size()));
    std::string want = before.data;
    const Box whole_dst = Box::Whole(dst_shape);
    for (const Piece& p : pieces) {
      const Held& s = srcs[p.src];
      const Shape src_shape(s.info.shape().begin(), s.info.shape().end());
      ASSERT_TRUE(p.src_offset.empty()) << "CopyAndCheck writes boxes of dst only";
      // src's row-major elements are those of its box of dst, in order.
      Shape box_shape(dst_shape.size() - src_shape.size(), 1);
      box_shape.insert(box_shape.end(), src_shape.begin(), src_shape.end());
      const Box box(p.dst_offset, box_shape);
      ASSERT_TRUE(CastBox(box, s.data.data(), box, DTypeFromProto(s.info.dtype()).value(),
                          want.data(), whole_dst, dst_dtype)
                      .ok());
    }
    EXPECT_NE(want, before.data) << "the members change nothing: a vacuous check";
    Held after = Get(dst);
    EXPECT_TRUE(after.data == want) << dst << ": values differ from the expected composition";
    for (const v1::CopyGroupMember& m : r->members()) {
      EXPECT_EQ(m.dst_version(), after.info.version());
    }
    EXPECT_GT(after.info.version(), before.info.version());
    EXPECT_EQ(after.info.spec(), before.info.spec());
    EXPECT_TRUE(after.info.busy_plan().empty()) << after.info.busy_plan();
    EXPECT_TRUE(SameChunks(after.info.layout(), before.info.layout()).ok());
    for (const auto& [name, s] : srcs) {
      Held now = Get(name);
      EXPECT_EQ(now.info.version(), s.info.version()) << name;
      EXPECT_TRUE(now.info.busy_plan().empty()) << name;
      EXPECT_TRUE(now.data == s.data) << name << " changed";
    }
  }
};

// q [64, 32], k [16, 32], v [16, 32] into qkv [96, 32]: sharded S(0) on 4 ranks (24 rows each:
// the cuts at 24, 48, 72 fall inside q and k's boxes) and S(1) on another mesh; v in bf16 is
// widened into the f32 dst.
TEST_F(FusedCopyTest, QkvIntoOneFusedTensor) {
  Create("q", {64, 32}, DType::kF32, "grid", "S(0),S(1)", v1::ARANGE);
  Create("k", {16, 32}, DType::kF32, "pair", "R", v1::RANDOM);
  Create("v", {16, 32}, DType::kBF16, "trio", "S(1)", v1::RANDOM);
  for (const auto& [name, mesh, spec] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"qkv_rows", "line", "S(0)"}, {"qkv_cols", "line_rev", "S(1)"}}) {
    Create(name, {96, 32}, DType::kF32, mesh, spec, v1::ZEROS);
    CopyAndCheck(name, {96, 32}, DType::kF32,
                 {{"q", {0, 0}, {}, {}}, {"k", {64, 0}, {}, {}}, {"v", {80, 0}, {}, {}}});
  }
}

// 8 experts [6, 4] (each on its own layout) into a stacked [8, 6, 4] on 4 ranks S(0) and on 3
// ranks S(1): the experts lack the leading dim of extent 1.
TEST_F(FusedCopyTest, EightExpertsIntoOneStackedTensor) {
  const std::vector<std::pair<std::string, std::string>> at = {
      {"line", "S(0)"},     {"grid", "S(1),R"}, {"pair", "R"}, {"trio", "S(0)"},
      {"line_rev", "S(1)"}, {"grid", "R,R"},    {"line", "R"}, {"trio", "S(1)"}};
  std::vector<Piece> pieces;
  for (int e = 0; e < 8; ++e) {
    const std::string name = absl::StrCat("expert", e);
    Create(name, {6, 4}, DType::kF32, at[e].first, at[e].second,
           e % 2 == 0 ? v1::ARANGE : v1::RANDOM);
    pieces.push_back({name, {e, 0, 0}, {}, {}});
  }
  Create("stacked_rows", {8, 6, 4}, DType::kF32, "line", "S(0)", v1::RANDOM);
  CopyAndCheck("stacked_rows", {8, 6, 4}, DType::kF32, pieces);
  Create("stacked_cols", {8, 6, 4}, DType::kF32, "trio", "S(1)", v1::ZEROS);
  CopyAndCheck("stacked_cols", {8, 6, 4}, DType::kF32, pieces);
}

// A single Copy with dst_offset: k into rows 64-79 of a random qkv; every other row keeps its
// old value.
TEST_F(FusedCopyTest, OneCopyIntoABoxKeepsTheRestOfDst) {
  Create("k1", {16, 32}, DType::kF32, "line", "S(1)", v1::ARANGE);
  Create("qkv1", {96, 32}, DType::kF32, "grid", "S(0),S(1)", v1::RANDOM);
  Held before = Get("qkv1");
  Held k = Get("k1");
  v1::CopyRequest copy;
  copy.set_src("k1");
  copy.set_dst("qkv1");
  copy.add_dst_offset(64);
  copy.add_dst_offset(0);
  copy.set_wait(true);
  absl::StatusOr<v1::CopyResponse> r = client().Copy(copy);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->progress().state(), v1::COMMITTED) << r->progress().error();
  Held after = Get("qkv1");
  EXPECT_EQ(after.info.version(), r->dst_version());
  EXPECT_GT(r->plan().bytes_moved(), 0) << "the relayed bytes are counted";
  std::string want = before.data;
  want.replace(64 * 32 * 4, k.data.size(), k.data);
  EXPECT_TRUE(after.data == want);
}

// The reverse: k out of qkv with src_offset/src_shape, and an expert out of a stacked tensor
// (the box [1, 6, 4] is the dst [6, 4]).
TEST_F(FusedCopyTest, SlicesOutOfFusedTensors) {
  Create("qkv2", {96, 32}, DType::kF32, "line", "S(0)", v1::ARANGE);
  Create("k2", {16, 32}, DType::kF32, "trio", "S(1)", v1::ZEROS);
  Create("stacked2", {8, 6, 4}, DType::kF32, "grid", "S(1),S(2)", v1::RANDOM);
  Create("e2", {6, 4}, DType::kBF16, "pair", "S(0)", v1::ZEROS);
  v1::CopyGroupRequest group;
  v1::CopyPair* k = group.add_copies();
  k->set_src("qkv2");
  k->set_dst("k2");
  for (int64_t d : {64, 0}) k->add_src_offset(d);
  for (int64_t d : {16, 32}) k->add_src_shape(d);
  v1::CopyPair* e = group.add_copies();
  e->set_src("stacked2");
  e->set_dst("e2");
  for (int64_t d : {5, 0, 0}) e->add_src_offset(d);
  for (int64_t d : {1, 6, 4}) e->add_src_shape(d);
  group.set_wait(true);
  Held qkv = Get("qkv2"), stacked = Get("stacked2");
  absl::StatusOr<v1::CopyGroupResponse> r = client().CopyGroup(group);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  EXPECT_TRUE(Get("k2").data == qkv.data.substr(64 * 32 * 4, 16 * 32 * 4));
  std::string want(6 * 4 * 2, '\0');
  const Box box({5, 0, 0}, {1, 6, 4});
  ASSERT_TRUE(CastBox(box, stacked.data.data(), Box::Whole({8, 6, 4}), DType::kF32, want.data(),
                      box, DType::kBF16)
                  .ok());
  EXPECT_TRUE(Get("e2").data == want);
  EXPECT_EQ(Get("qkv2").info.version(), qkv.info.version());
}

// Large fused tensors run on the workers (stage each member on dst's ranks, compose each dst
// rank's buffer there): q, k [1024, 1024] bf16 widened and v f32 into qkv [3072, 1024] f32,
// 3 MiB per rank on 4 ranks S(0) and 4 MiB per rank on 3 ranks S(1), values checked exactly.
TEST_F(FusedCopyTest, LargeQkvIntoOneFusedTensor) {
  Create("bq", {1024, 1024}, DType::kBF16, "grid", "S(0),S(1)", v1::RANDOM);
  Create("bk", {1024, 1024}, DType::kBF16, "pair", "R", v1::RANDOM);
  Create("bv", {1024, 1024}, DType::kF32, "trio", "S(1)", v1::ARANGE);
  for (const auto& [name, mesh, spec] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"bqkv_rows", "line", "S(0)"}, {"bqkv_cols", "trio", "S(1)"}}) {
    Create(name, {3072, 1024}, DType::kF32, mesh, spec, v1::RANDOM);
    CopyAndCheck(name, {3072, 1024}, DType::kF32,
                 {{"bq", {0, 0}, {}, {}}, {"bk", {1024, 0}, {}, {}}, {"bv", {2048, 0}, {}, {}}});
  }
  // Only part of dst written: the rest keeps its old values (composed from the old buffer).
  CopyAndCheck("bqkv_rows", {3072, 1024}, DType::kF32, {{"bk", {1536, 0}, {}, {}}});
}

// 8 experts [384, 512] f32 (768 KiB each, on their own layouts) into a stacked [8, 384, 512]:
// 1.5 MiB per rank on 4 ranks S(0), 2 MiB on 3 ranks S(1).
TEST_F(FusedCopyTest, LargeExpertsIntoOneStackedTensor) {
  const std::vector<std::pair<std::string, std::string>> at = {
      {"line", "S(0)"},     {"grid", "S(1),R"}, {"pair", "R"}, {"trio", "S(0)"},
      {"line_rev", "S(1)"}, {"grid", "R,R"},    {"line", "R"}, {"trio", "S(1)"}};
  std::vector<Piece> pieces;
  for (int e = 0; e < 8; ++e) {
    const std::string name = absl::StrCat("bexpert", e);
    Create(name, {384, 512}, DType::kF32, at[e].first, at[e].second,
           e % 2 == 0 ? v1::ARANGE : v1::RANDOM);
    pieces.push_back({name, {e, 0, 0}, {}, {}});
  }
  Create("bstacked_rows", {8, 384, 512}, DType::kF32, "line", "S(0)", v1::ZEROS);
  CopyAndCheck("bstacked_rows", {8, 384, 512}, DType::kF32, pieces);
  Create("bstacked_cols", {8, 384, 512}, DType::kF32, "trio", "S(1)", v1::RANDOM);
  CopyAndCheck("bstacked_cols", {8, 384, 512}, DType::kF32, pieces);
}

// Large dsts whose layouts are not plain cuts: 3 experts [512, 1024] f32 into [3, 512, 1024]
// S(0) on 4 ranks (2 MiB on ranks 0-2, none on rank 3) and replicated on 2 ranks (6 MiB each,
// every replica composes its own buffer).
TEST_F(FusedCopyTest, LargeStackedWithAnEmptyRankAndReplicas) {
  std::vector<Piece> pieces;
  for (int e = 0; e < 3; ++e) {
    const std::string name = absl::StrCat("cexpert", e);
    Create(name, {512, 1024}, DType::kF32, e == 1 ? "pair" : "line", e == 1 ? "R" : "S(1)",
           v1::RANDOM);
    pieces.push_back({name, {e, 0, 0}, {}, {}});
  }
  Create("cstacked_rows", {3, 512, 1024}, DType::kF32, "line", "S(0)", v1::ZEROS);
  CopyAndCheck("cstacked_rows", {3, 512, 1024}, DType::kF32, pieces);
  Create("cstacked_replicas", {3, 512, 1024}, DType::kF32, "pair", "R", v1::RANDOM);
  CopyAndCheck("cstacked_replicas", {3, 512, 1024}, DType::kF32, {pieces[0], pieces[2]});
}

// The reverse on large tensors, in one group with a whole member: k out of qkv [3072, 1024]
// (S(0), 3 MiB per rank), expert 5 out of a stacked [8, 384, 512] (S(1),S(2)) narrowed to
// bf16, and a whole tensor copied alongside; every dst commits together.
TEST_F(FusedCopyTest, LargeSlicesOutOfFusedTensors) {
  Create("bqkv2", {3072, 1024}, DType::kF32, "line", "S(0)", v1::RANDOM);
  Create("bk2", {1024, 1024}, DType::kF32, "trio", "S(1)", v1::ZEROS);
  Create("bstacked2", {8, 384, 512}, DType::kF32, "grid", "S(1),S(2)", v1::RANDOM);
  Create("be2", {384, 512}, DType::kBF16, "pair", "S(0)", v1::ZEROS);
  Create("bw", {512, 512}, DType::kF32, "line", "S(1)", v1::ARANGE);
  Create("bw2", {512, 512}, DType::kF32, "trio", "S(0)", v1::ZEROS);
  v1::CopyGroupRequest group;
  v1::CopyPair* k = group.add_copies();
  k->set_src("bqkv2");
  k->set_dst("bk2");
  for (int64_t d : {1024, 0}) k->add_src_offset(d);
  for (int64_t d : {1024, 1024}) k->add_src_shape(d);
  v1::CopyPair* e = group.add_copies();
  e->set_src("bstacked2");
  e->set_dst("be2");
  for (int64_t d : {5, 0, 0}) e->add_src_offset(d);
  for (int64_t d : {1, 384, 512}) e->add_src_shape(d);
  v1::CopyPair* w = group.add_copies();
  w->set_src("bw");
  w->set_dst("bw2");
  group.set_wait(true);
  Held qkv = Get("bqkv2"), stacked = Get("bstacked2"), whole = Get("bw");
  const int64_t k_version = Get("bk2").info.version();
  absl::StatusOr<v1::CopyGroupResponse> r = client().CopyGroup(group);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), v1::COMMITTED);
  EXPECT_GT(r->bytes_moved(), 0);
  Held k2 = Get("bk2");
  EXPECT_GT(k2.info.version(), k_version);
  EXPECT_TRUE(k2.data == qkv.data.substr(1024 * 1024 * 4, 1024 * 1024 * 4));
  std::string want(384 * 512 * 2, '\0');
  const Box box({5, 0, 0}, {1, 384, 512});
  ASSERT_TRUE(CastBox(box, stacked.data.data(), Box::Whole({8, 384, 512}), DType::kF32, want.data(),
                      box, DType::kBF16)
                  .ok());
  EXPECT_TRUE(Get("be2").data == want);
  EXPECT_TRUE(Get("bw2").data == whole.data);
  Held qkv_after = Get("bqkv2");
  EXPECT_EQ(qkv_after.info.version(), qkv.info.version());
  EXPECT_TRUE(qkv_after.info.busy_plan().empty());
  EXPECT_TRUE(qkv_after.data == qkv.data);
  // A single large Copy out of a box, which reports the bytes it moved.
  v1::CopyRequest copy;
  copy.set_src("bqkv2");
  copy.set_dst("bk2");
  for (int64_t d : {2048, 0}) copy.add_src_offset(d);
  for (int64_t d : {1024, 1024}) copy.add_src_shape(d);
  copy.set_wait(true);
  absl::StatusOr<v1::CopyResponse> one = client().Copy(copy);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->progress().state(), v1::COMMITTED) << one->progress().error();
  EXPECT_GT(one->plan().bytes_moved(), 0);
  EXPECT_TRUE(Get("bk2").data == qkv.data.substr(2048 * 1024 * 4, 1024 * 1024 * 4));
}

// Bad boxes answer INVALID_ARGUMENT naming the member and field, and change nothing.
TEST_F(FusedCopyTest, BadBoxesAreRefusedAndChangeNothing) {
  Create("q3", {64, 32}, DType::kF32, "line", "S(0)", v1::ARANGE);
  Create("k3", {16, 32}, DType::kF32, "pair", "R", v1::ARANGE);
  Create("qkv3", {96, 32}, DType::kF32, "line", "S(0)", v1::RANDOM);
  Held before = Get("qkv3");
  struct Case {
    std::vector<Piece> pieces;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{{"q3", {0, 0}, {}, {}}, {"k3", {90, 0}, {}, {}}},
       "copies[1].dst_offset: box [90:106, 0:32] is out of range of dst 'qkv3' shape [96, 32]"},
      {{{"q3", {0, 0}, {}, {}}, {"k3", {48, 0}, {}, {}}},
       "copies[1].dst_offset: box [48:64, 0:32] overlaps copies[0]'s [0:64, 0:32] of dst "
       "'qkv3'"},
      {{{"k3", {0, 64, 0}, {}, {}}},
       "copies[0].dst_offset: offset [0, 64, 0] has 3 dims; dst 'qkv3' shape [96, 32] has 2"},
      {{{"q3", {}, {0, 0}, {16, 32}}},
       "copies[0].src_shape: box shape [16, 32] differs from dst 'qkv3' shape [96, 32]"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<v1::CopyGroupResponse> r = client().CopyGroup(GroupOf("qkv3", c.pieces));
    ASSERT_FALSE(r.ok()) << c.message;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
  // A single Copy, as a group of one.
  v1::CopyRequest copy;
  copy.set_src("k3");
  copy.set_dst("qkv3");
  copy.add_dst_offset(88);
  copy.add_dst_offset(0);
  absl::StatusOr<v1::CopyResponse> one = client().Copy(copy);
  EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument) << one.status();
  EXPECT_THAT(std::string(one.status().message()), HasSubstr("copies[0].dst_offset: box [88:104"));
  Held after = Get("qkv3");
  EXPECT_EQ(after.info.version(), before.info.version());
  EXPECT_TRUE(after.info.busy_plan().empty());
  EXPECT_TRUE(after.data == before.data);
  for (const char* name : {"q3", "k3"}) {
    absl::StatusOr<v1::TensorInfo> t = client().GetTensor(name);
    ASSERT_TRUE(t.ok());
    EXPECT_TRUE(t->busy_plan().empty()) << name;
  }
  // Prepared transfers refuse slices.
  v1::CreateTransferRequest create;
  create.set_name("fused");
  *create.mutable_copies() = GroupOf("qkv3", {{"k3", {64, 0}, {}, {}}}).copies();
  absl::StatusOr<v1::TransferInfo> t = client().CreateTransfer(create);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("copies[0].dst_offset"));
}

}  // namespace
}  // namespace shardcoord
