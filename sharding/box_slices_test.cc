#include "sharding/box_slices.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/test_layouts.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;

SliceMember Into(const std::string& src, Shape src_shape, const std::string& dst, Shape dst_shape,
                 Shape offset) {
  SliceMember m;
  m.src = src;
  m.dst = dst;
  m.src_shape = std::move(src_shape);
  m.dst_shape = std::move(dst_shape);
  m.dst_offset = std::move(offset);
  return m;
}

SliceMember OutOf(const std::string& src, Shape src_shape, Shape offset, Shape box,
                  const std::string& dst, Shape dst_shape) {
  SliceMember m;
  m.src = src;
  m.dst = dst;
  m.src_shape = std::move(src_shape);
  m.dst_shape = std::move(dst_shape);
  m.src_offset = std::move(offset);
  m.src_box_shape = std::move(box);
  return m;
}

void ExpectInvalid(const absl::Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
}

TEST(ResolveSlicesTest, QkvIntoFused) {
  std::vector<SliceMember> m = {Into("q", {64, 32}, "qkv", {96, 32}, {0, 0}),
                                Into("k", {16, 32}, "qkv", {96, 32}, {64, 0}),
                                Into("v", {16, 32}, "qkv", {96, 32}, {80, 0})};
  absl::StatusOr<std::vector<SliceBoxes>> b = ResolveSlices(m, "copies");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)[1].dst, Box({64, 0}, {16, 32}));
  EXPECT_EQ((*b)[1].src, Box({0, 0}, {16, 32}));
  EXPECT_TRUE((*b)[1].sliced_dst);
  EXPECT_FALSE((*b)[1].sliced_src);
}

TEST(ResolveSlicesTest, ExpertLacksTheLeadingDimOfOne) {
  absl::StatusOr<std::vector<SliceBoxes>> b =
      ResolveSlices({Into("e3", {8, 4}, "experts", {8, 8, 4}, {3, 0, 0})}, "copies");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)[0].dst, Box({3, 0, 0}, {1, 8, 4}));
}

TEST(ResolveSlicesTest, Refusals) {
  ExpectInvalid(ResolveSlices({Into("k", {16, 32}, "qkv", {96, 32}, {90, 0})}, "copies").status(),
                "copies[0].dst_offset: box [90:106, 0:32] is out of range of dst 'qkv' shape "
                "[96, 32]");
  ExpectInvalid(ResolveSlices({Into("k", {16, 32}, "qkv", {96, 32}, {64})}, "copies").status(),
                "copies[0].dst_offset: offset [64] has 1 dims; dst 'qkv' shape [96, 32] has 2");
  ExpectInvalid(
      ResolveSlices({Into("k", {2, 16, 32}, "qkv", {96, 32}, {64, 0})}, "copies").status(),
      "copies[0].dst_offset: src 'k' shape [2, 16, 32] has more dims than dst 'qkv'");
  ExpectInvalid(ResolveSlices({Into("k", {16, 32}, "qkv", {96, 32}, {-1, 0})}, "copies").status(),
                "out of range");
  ExpectInvalid(ResolveSlices({Into("q", {64, 32}, "qkv", {96, 32}, {0, 0}),
                               Into("k", {16, 32}, "qkv", {96, 32}, {48, 0})},
                              "copies")
                    .status(),
                "copies[1].dst_offset: box [48:64, 0:32] overlaps copies[0]'s [0:64, 0:32] of "
                "dst 'qkv'");
  // A whole-dst member overlaps any box of the same dst.
  SliceMember whole = Into("w", {96, 32}, "qkv", {96, 32}, {0, 0});
  whole.dst_offset.reset();
  ExpectInvalid(
      ResolveSlices({Into("k", {16, 32}, "qkv", {96, 32}, {64, 0}), whole}, "copies").status(),
      "copies[1].dst: box [0:96, 0:32] overlaps copies[0]'s");
  // Different shapes need a box.
  SliceMember bare = whole;
  bare.src_shape = {16, 32};
  ExpectInvalid(ResolveSlice(bare, "copies[0]").status(),
                "copies[0].dst: src 'w' shape [16, 32] differs from dst 'qkv' shape [96, 32] "
                "(give dst_offset");
  // src_shape without src_offset.
  SliceMember half = OutOf("qkv", {96, 32}, {0, 0}, {16, 32}, "k", {16, 32});
  half.src_offset.reset();
  ExpectInvalid(ResolveSlice(half, "copies[0]").status(), "copies[0].src_offset: missing");
}

TEST(ResolveSlicesTest, ManyExpertsAndTheFirstOverlapInMemberOrder) {
  std::vector<SliceMember> m;
  for (int64_t e = 0; e < 256; ++e)
    m.push_back(Into("e", {6, 4}, "stacked", {256, 6, 4}, {e, 0, 0}));
  ASSERT_TRUE(ResolveSlices(m, "copies").ok());
  // Member 200 repeats expert 7 and member 100 half-covers expert 9's rows: 100 comes first.
  m[200].dst_offset = Shape{7, 0, 0};
  m.push_back(Into("x", {2, 6, 4}, "stacked", {256, 6, 4}, {9, 0, 0}));
  m[100] = Into("y", {1, 3, 4}, "stacked", {256, 6, 4}, {9, 3, 0});
  ExpectInvalid(
      ResolveSlices(m, "copies").status(),
      "copies[100].dst_offset: box [9:10, 3:6, 0:4] overlaps copies[9]'s [9:10, 0:6, 0:4]");
}

TEST(ResolveSlicesTest, DisjointBoxesOfDifferentDstsMayOverlapInCoordinates) {
  EXPECT_TRUE(
      ResolveSlices({Into("a", {4}, "x", {8}, {0}), Into("b", {4}, "y", {8}, {0})}, "copies").ok());
}

TEST(ResolveSlicesTest, SrcBoxes) {
  absl::StatusOr<SliceBoxes> b =
      ResolveSlice(OutOf("qkv", {96, 32}, {64, 0}, {16, 32}, "k", {16, 32}), "copies[0]");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->src, Box({64, 0}, {16, 32}));
  EXPECT_EQ(b->dst, Box({0, 0}, {16, 32}));
  // An expert out of a stacked tensor: the box [1, 8, 4] is the dst [8, 4].
  b = ResolveSlice(OutOf("experts", {8, 8, 4}, {5, 0, 0}, {1, 8, 4}, "e5", {8, 4}), "copies[0]");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->dst, Box({0, 0}, {8, 4}));
  ExpectInvalid(
      ResolveSlice(OutOf("qkv", {96, 32}, {64, 0}, {16, 16}, "k", {16, 32}), "copies[0]").status(),
      "copies[0].src_shape: box shape [16, 16] differs from dst 'k' shape [16, 32]");
  ExpectInvalid(
      ResolveSlice(OutOf("qkv", {96, 32}, {90, 0}, {16, 32}, "k", {16, 32}), "copies[0]").status(),
      "copies[0].src_offset: box [90:106, 0:32] is out of range of src 'qkv' shape [96, 32]");
  ExpectInvalid(
      ResolveSlice(OutOf("qkv", {96, 32}, {64, 0}, {16}, "k", {16, 32}), "copies[0]").status(),
      "copies[0].src_shape: [16] has 1 dims");
}

TEST(RestrictLayoutTest, ShardedRowsCutAcrossTheBox) {
  // qkv [96, 32] on 4 ranks S(0): rows 0-23, 24-47, 48-71, 72-95; k's box is rows 64-79.
  Layout qkv = Placed({4}, {96, 32}, "S(0)");
  absl::StatusOr<Layout> k = RestrictLayout(qkv, Box({64, 0}, {16, 32}), {16, 32});
  ASSERT_TRUE(k.ok()) << k.status();
  EXPECT_EQ(k->global_shape(), (Shape{16, 32}));
  ASSERT_EQ(k->ranks().size(), 4u);
  EXPECT_TRUE(k->ranks()[0].chunks.empty());
  EXPECT_TRUE(k->ranks()[1].chunks.empty());
  ASSERT_EQ(k->ranks()[2].chunks.size(), 1u);
  EXPECT_EQ(k->ranks()[2].chunks[0].box, Box({0, 0}, {8, 32}));
  EXPECT_EQ(k->ranks()[2].local_elements, 8 * 32);
  EXPECT_EQ(k->ranks()[3].chunks[0].box, Box({8, 0}, {8, 32}));
  EXPECT_EQ(k->ranks()[3].chunks[0].local_offset, 0);
}

TEST(RestrictLayoutTest, ExpertOfAStackedTensorDropsTheLeadingOne) {
  // [8, 8, 4] S(1) on 2 ranks: each rank holds rows 0-3 or 4-7 of every expert.
  Layout stacked = Placed({2}, {8, 8, 4}, "S(1)");
  absl::StatusOr<Layout> e = RestrictLayout(stacked, Box({3, 0, 0}, {1, 8, 4}), {8, 4});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->ranks()[1].chunks[0].box, Box({4, 0}, {4, 4}));
  // Replicated: both ranks hold the whole box.
  absl::StatusOr<Layout> r =
      RestrictLayout(Placed({2}, {8, 8, 4}, "R"), Box({3, 0, 0}, {1, 8, 4}), {8, 4});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->ranks()[0].chunks[0].box, Box({0, 0}, {8, 4}));
  EXPECT_EQ(r->ranks()[1].chunks[0].box, Box({0, 0}, {8, 4}));
  // The reverse view: a [8, 4] tensor seen as the box [1, 8, 4] of nothing larger.
  ExpectInvalid(RestrictLayout(stacked, Box({3, 0, 0}, {1, 8, 4}), {8, 3}).status(),
                "is not that of box");
  ExpectInvalid(RestrictLayout(stacked, Box({7, 0, 0}, {2, 8, 4}), {2, 8, 4}).status(),
                "out of range");
}

TEST(RestrictLayoutTest, SeveralChunksPerRankArePacked) {
  // 2x2 mesh S(0),S(1) then the box covers parts of all four ranks.
  Layout l = Placed({2, 2}, {8, 8}, "S(0),S(1)");
  absl::StatusOr<Layout> v = RestrictLayout(l, Box({2, 2}, {4, 4}), {4, 4});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->ranks()[0].chunks[0].box, Box({0, 0}, {2, 2}));
  EXPECT_EQ(v->ranks()[3].chunks[0].box, Box({2, 2}, {2, 2}));
  EXPECT_EQ(v->ranks()[3].local_elements, 4);
}

TEST(MapBoxTest, BetweenAnExpertAndItsStackedBox) {
  const Box expert({0, 0}, {8, 4});
  const Box stacked({3, 0, 0}, {1, 8, 4});
  EXPECT_EQ(MapBox(Box({4, 0}, {4, 4}), expert, stacked), Box({3, 4, 0}, {1, 4, 4}));
  EXPECT_EQ(MapBox(Box({3, 4, 0}, {1, 4, 4}), stacked, expert), Box({4, 0}, {4, 4}));
  EXPECT_EQ(MapBox(Box({70, 2}, {2, 3}), Box({64, 0}, {16, 32}), Box({0, 0}, {16, 32})),
            Box({6, 2}, {2, 3}));
}

TEST(PlaceBoxTest, AddsLeadingDimsThenTheOffset) {
  // An expert's chunk [0:4, 2:6] of a [2I, H] placed at [3, 0, 0] of a stacked [E, 2I, H].
  absl::StatusOr<Box> at = PlaceBox(Box({0, 2}, {4, 4}), {3, 0, 0});
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, Box({3, 0, 2}, {1, 4, 4}));
  // The reverse: a chunk of the stacked tensor moved to the box's origin.
  at = PlaceBox(Box({3, 0, 2}, {1, 4, 4}), {-3, 0, 0});
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, Box({0, 0, 2}, {1, 4, 4}));
  EXPECT_EQ(PlaceBox(Box({0, 0, 0}, {1, 2, 2}), {0, 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Partly before the frame's origin: the part at negative coordinates matches no chunk.
  at = PlaceBox(Box({0, 0}, {2, 2}), {-1, 0});
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(*at, Box({-1, 0}, {2, 2}));
  EXPECT_EQ(at->Intersect(Box({0, 0}, {4, 4})), Box({0, 0}, {1, 2}));
}

int64_t VolumeOf(const std::vector<Box>& boxes) {
  int64_t v = 0;
  for (const Box& b : boxes) v += b.Volume();
  return v;
}

TEST(SubtractBoxesTest, LeavesExactlyWhatNoCutCovers) {
  const Box chunk({0, 0}, {8, 4});
  EXPECT_TRUE(SubtractBoxes(chunk, {Box({0, 0}, {8, 4})}).empty());
  EXPECT_TRUE(SubtractBoxes(chunk, {Box({0, 0}, {5, 4}), Box({4, 0}, {4, 4})}).empty());
  // A hole in the middle: the rest is 32 - 4 elements in disjoint boxes around it.
  std::vector<Box> left = SubtractBoxes(chunk, {Box({2, 1}, {2, 2})});
  EXPECT_EQ(VolumeOf(left), 28);
  for (size_t i = 0; i < left.size(); ++i) {
    EXPECT_FALSE(left[i].Overlaps(Box({2, 1}, {2, 2})));
    for (size_t j = i + 1; j < left.size(); ++j) EXPECT_FALSE(left[i].Overlaps(left[j]));
  }
  // Rows 0:3 and 6:8 cut: rows 3:6 are left, as one box.
  left = SubtractBoxes(chunk, {Box({0, 0}, {3, 4}), Box({6, 0}, {2, 4}), Box({0, 0}, {1, 1})});
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0], Box({3, 0}, {3, 4}));
  EXPECT_EQ(SubtractBoxes(chunk, {Box({9, 0}, {1, 4})}), std::vector<Box>{chunk});
}

}  // namespace
}  // namespace shardcoord
