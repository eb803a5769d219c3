#include "sharding/layout.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::Mesh;
using ::testing::HasSubstr;

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

absl::StatusOr<Layout> FromText(const DeviceMesh& mesh, const Shape& shape,
                                const std::string& placements) {
  absl::StatusOr<std::vector<Placement>> p = ParsePlacements(placements);
  if (!p.ok()) return p.status();
  return Layout::FromPlacements(mesh, shape, *p);
}

Layout MustPlace(const DeviceMesh& mesh, const Shape& shape, const std::string& placements) {
  absl::StatusOr<Layout> l = FromText(mesh, shape, placements);
  EXPECT_TRUE(l.ok()) << placements << ": " << l.status();
  if (!l.ok()) return Layout();
  // Placement layouts are built without ValidateLayout; they must pass it anyway.
  EXPECT_TRUE(ValidateLayout(l->global_shape(), l->ranks(), l->num_partials()).ok());
  return *std::move(l);
}

void ExpectInvalid(const absl::Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
}

// The single chunk that a placement layout gives `rank`.
const Chunk& OnlyChunk(const Layout& l, int64_t rank) {
  const RankChunks* rc = l.Find(rank);
  EXPECT_NE(rc, nullptr) << "rank " << rank;
  EXPECT_EQ(rc->chunks.size(), 1u);
  return rc->chunks[0];
}

// ---------------------------------------------------------------------------------------
// ChunkPiece: torch.chunk.

TEST(ChunkPieceTest, MatchesTorchChunk) {
  // torch.chunk(n, k) returns ceil(n / cs) pieces of cs = ceil(n / k) (the last one
  // smaller); DTensor pads the missing ones as empty pieces at the end of the extent.
  for (int64_t n = 0; n <= 40; ++n) {
    for (int64_t k = 1; k <= 12; ++k) {
      const int64_t cs = (n + k - 1) / k;
      int64_t expect_start = 0;
      for (int64_t j = 0; j < k; ++j) {
        const auto [start, size] = ChunkPiece(n, k, j);
        const int64_t want = std::max<int64_t>(0, std::min(cs, n - j * cs));
        ASSERT_EQ(size, want) << "n=" << n << " k=" << k << " j=" << j;
        ASSERT_EQ(start, std::min(j * cs, n)) << "n=" << n << " k=" << k << " j=" << j;
        ASSERT_EQ(start, expect_start);  // Pieces are contiguous.
        expect_start += size;
      }
      ASSERT_EQ(expect_start, n);
    }
  }
  EXPECT_EQ(ChunkPiece(5, 4, 3), std::make_pair(int64_t{5}, int64_t{0}));
  EXPECT_EQ(ChunkPiece(7, 3, 2), std::make_pair(int64_t{6}, int64_t{1}));
}

// ---------------------------------------------------------------------------------------
// FromPlacements.

TEST(FromPlacementsTest, NestedShardOnOneDim) {
  Layout l = MustPlace(Mesh({2, 4}), {8, 4}, "S(0),S(0)");
  ASSERT_EQ(l.ranks().size(), 8u);
  for (int64_t r = 0; r < 8; ++r) {
    const RankChunks& rc = l.ranks()[r];
    EXPECT_EQ(rc.rank, r);
    EXPECT_EQ(rc.coord, (Shape{r / 4, r % 4}));
    EXPECT_EQ(rc.local_elements, 4);
    const Chunk& c = OnlyChunk(l, r);
    EXPECT_EQ(c.box.offset(), (Shape{r, 0})) << "rank " << r;
    EXPECT_EQ(c.box.shape(), (Shape{1, 4})) << "rank " << r;
    EXPECT_EQ(c.local_offset, 0);
    EXPECT_EQ(c.partial_index, 0);
  }
  EXPECT_FALSE(l.is_partial());
  EXPECT_EQ(l.num_partials(), 1);
  EXPECT_EQ(l.num_elements(), 32);
  EXPECT_EQ(l.SpecString(), "S(0),S(0) on mesh 2x4");
}

TEST(FromPlacementsTest, MoreRanksThanElements) {
  Layout l = MustPlace(Mesh({8}), {2}, "S(0)");
  EXPECT_EQ(OnlyChunk(l, 0).box, Box({0}, {1}));
  EXPECT_EQ(OnlyChunk(l, 1).box, Box({1}, {1}));
  for (int64_t r = 2; r < 8; ++r) {
    EXPECT_EQ(OnlyChunk(l, r).box, Box({2}, {0})) << "rank " << r;
    EXPECT_EQ(l.Find(r)->local_elements, 0);
  }
}

TEST(FromPlacementsTest, UnevenShard) {
  Layout l = MustPlace(Mesh({4}), {5}, "S(0)");
  EXPECT_EQ(OnlyChunk(l, 0).box, Box({0}, {2}));
  EXPECT_EQ(OnlyChunk(l, 1).box, Box({2}, {2}));
  EXPECT_EQ(OnlyChunk(l, 2).box, Box({4}, {1}));
  EXPECT_EQ(OnlyChunk(l, 3).box, Box({5}, {0}));
}

TEST(FromPlacementsTest, NestedUnevenShardKeepsEmptyPiecesAtTheEndOfTheirExtent) {
  // Mesh dim 0 cuts [0,3) and [3,5); mesh dim 1 cuts each of those in two.
  Layout l = MustPlace(Mesh({2, 2}), {5}, "S(0),S(0)");
  EXPECT_EQ(OnlyChunk(l, 0).box, Box({0}, {2}));
  EXPECT_EQ(OnlyChunk(l, 1).box, Box({2}, {1}));
  EXPECT_EQ(OnlyChunk(l, 2).box, Box({3}, {1}));
  EXPECT_EQ(OnlyChunk(l, 3).box, Box({4}, {1}));
  // (3,) on 2x4: [0,2) -> 0:1, 1:2, then empty at 2, 2; [2,3) -> 2:3, then empty at 3.
  Layout m = MustPlace(Mesh({2, 4}), {3}, "S(0),S(0)");
  const std::vector<Box> want = {Box({0}, {1}), Box({1}, {1}), Box({2}, {0}), Box({2}, {0}),
                                 Box({2}, {1}), Box({3}, {0}), Box({3}, {0}), Box({3}, {0})};
  for (int64_t r = 0; r < 8; ++r) EXPECT_EQ(OnlyChunk(m, r).box, want[r]) << "rank " << r;
}

TEST(FromPlacementsTest, ZeroExtent) {
  Layout l = MustPlace(Mesh({2}), {0, 4}, "S(0)");
  EXPECT_EQ(OnlyChunk(l, 0).box, Box({0, 0}, {0, 4}));
  EXPECT_EQ(OnlyChunk(l, 1).box, Box({0, 0}, {0, 4}));
  Layout m = MustPlace(Mesh({3}), {4, 0}, "S(0)");
  EXPECT_EQ(OnlyChunk(m, 2).box, Box({4, 0}, {0, 0}));
}

TEST(FromPlacementsTest, ScalarReplicated) {
  Layout l = MustPlace(Mesh({3}), {}, "R");
  for (int64_t r = 0; r < 3; ++r) {
    EXPECT_EQ(OnlyChunk(l, r).box, Box({}, {}));
    EXPECT_EQ(l.Find(r)->local_elements, 1);
  }
  ExpectInvalid(FromText(Mesh({3}), {}, "S(0)").status(), "S(0)");
}

TEST(FromPlacementsTest, ExplicitSizes) {
  Layout l = MustPlace(Mesh({2}), {8}, "S(0,[3,5])");
  EXPECT_EQ(OnlyChunk(l, 0).box, Box({0}, {3}));
  EXPECT_EQ(OnlyChunk(l, 1).box, Box({3}, {5}));
  Layout z = MustPlace(Mesh({3}), {2, 8}, "S(1,[0,8,0])");
  EXPECT_EQ(OnlyChunk(z, 0).box, Box({0, 0}, {2, 0}));
  EXPECT_EQ(OnlyChunk(z, 1).box, Box({0, 0}, {2, 8}));
  EXPECT_EQ(OnlyChunk(z, 2).box, Box({0, 8}, {2, 0}));
  // Explicit sizes after an even split apply to each piece.
  Layout n = MustPlace(Mesh({2, 2}), {8}, "S(0),S(0,[1,3])");
  EXPECT_EQ(OnlyChunk(n, 0).box, Box({0}, {1}));
  EXPECT_EQ(OnlyChunk(n, 1).box, Box({1}, {3}));
  EXPECT_EQ(OnlyChunk(n, 2).box, Box({4}, {1}));
  EXPECT_EQ(OnlyChunk(n, 3).box, Box({5}, {3}));
}

TEST(FromPlacementsTest, ExplicitSizesMustSumToTheExtent) {
  ExpectInvalid(FromText(Mesh({2}), {8}, "S(0,[3,4])").status(),
                "placement S(0,[3,4]) at mesh dim 0: sizes sum to 7 but the extent of tensor "
                "dim 0 there is 8");
  ExpectInvalid(FromText(Mesh({2}), {8}, "S(0,[3,6])").status(), "sizes sum to 9");
  ExpectInvalid(FromText(Mesh({2}), {8}, "S(0,[8])").status(),
                "has 1 sizes but the mesh dim has 2 positions");
  // After S(0) the second mesh dim sees extents 3 and 2; [2,1] fits only the first.
  ExpectInvalid(FromText(Mesh({2, 2}), {5}, "S(0),S(0,[2,1])").status(),
                "at mesh dim 1: sizes sum to 3 but the extent of tensor dim 0 there is 2");
}

TEST(FromPlacementsTest, ExplicitSizesBuiltDirectlyAreChecked) {
  // ParsePlacements rejects these, but a Placement can be built by hand.
  ExpectInvalid(Layout::FromPlacements(Mesh({3}), {8}, {Placement::Shard(0, {-1, 5, 4})}).status(),
                "size -1 is negative");
  // A sum that overflows int64 is INVALID_ARGUMENT, not UB.
  ExpectInvalid(
      Layout::FromPlacements(Mesh({3}), {8}, {Placement::Shard(0, {kMax, kMax, 10})}).status(),
      "sizes sum to more than int64 max");
}

TEST(FromPlacementsTest, ShardDimOutOfRange) {
  ExpectInvalid(FromText(Mesh({2}), {4, 4}, "S(3)").status(),
                "placement S(3) at mesh dim 0: tensor of shape [4, 4] has 2 dims");
  ExpectInvalid(FromText(Mesh({2}), {4, 4}, "S(2)").status(), "S(2)");
  ExpectInvalid(FromText(Mesh({2, 2}), {4, 4}, "R,S(-3)").status(), "S(-3) at mesh dim 1");
}

TEST(FromPlacementsTest, NegativeDimIsNormalised) {
  Layout neg = MustPlace(Mesh({2}), {4, 6}, "S(-1)");
  Layout pos = MustPlace(Mesh({2}), {4, 6}, "S(1)");
  EXPECT_EQ(neg, pos);
  EXPECT_EQ(OnlyChunk(neg, 1).box, Box({0, 3}, {4, 3}));
  EXPECT_EQ(PlacementsToString(neg.placements()), "S(1)");
  EXPECT_EQ(neg.Fingerprint(), pos.Fingerprint());
  EXPECT_EQ(OnlyChunk(MustPlace(Mesh({2}), {4, 6}, "S(-2)"), 1).box, Box({2, 0}, {2, 6}));
}

TEST(FromPlacementsTest, ReplicateAndShard) {
  // R,S(1) on 2x3 for (4,6): rank (i,j) holds columns [2j, 2j+2) of every row.
  Layout l = MustPlace(Mesh({2, 3}), {4, 6}, "R,S(1)");
  for (int64_t r = 0; r < 6; ++r) {
    const int64_t j = r % 3;
    EXPECT_EQ(OnlyChunk(l, r).box, Box({0, 2 * j}, {4, 2})) << "rank " << r;
  }
  // S(1),S(0): two tensor dims across two mesh dims.
  Layout g = MustPlace(Mesh({2, 2}), {4, 6}, "S(1),S(0)");
  EXPECT_EQ(OnlyChunk(g, 0).box, Box({0, 0}, {2, 3}));
  EXPECT_EQ(OnlyChunk(g, 1).box, Box({2, 0}, {2, 3}));
  EXPECT_EQ(OnlyChunk(g, 2).box, Box({0, 3}, {2, 3}));
  EXPECT_EQ(OnlyChunk(g, 3).box, Box({2, 3}, {2, 3}));
  // All replicated: everyone holds everything.
  Layout rr = MustPlace(Mesh({2, 2}), {4, 6}, "R,R");
  for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(OnlyChunk(rr, r).box, Box({0, 0}, {4, 6}));
}

TEST(FromPlacementsTest, Partial) {
  Layout l = MustPlace(Mesh({2, 2}), {4}, "P(sum),S(0)");
  EXPECT_TRUE(l.is_partial());
  EXPECT_EQ(l.num_partials(), 2);
  EXPECT_EQ(l.partial_op(), ReduceOp::kSum);
  EXPECT_EQ(OnlyChunk(l, 0).box, Box({0}, {2}));
  EXPECT_EQ(OnlyChunk(l, 0).partial_index, 0);
  EXPECT_EQ(OnlyChunk(l, 1).box, Box({2}, {2}));
  EXPECT_EQ(OnlyChunk(l, 1).partial_index, 0);
  EXPECT_EQ(OnlyChunk(l, 2).box, Box({0}, {2}));
  EXPECT_EQ(OnlyChunk(l, 2).partial_index, 1);
  EXPECT_EQ(OnlyChunk(l, 3).partial_index, 1);

  // Partial index is row-major over the Partial mesh dims only.
  Layout m = MustPlace(Mesh({2, 3, 2}), {6}, "P(max),S(0),P(max)");
  EXPECT_EQ(m.num_partials(), 4);
  EXPECT_EQ(m.partial_op(), ReduceOp::kMax);
  for (const RankChunks& rc : m.ranks()) {
    EXPECT_EQ(rc.chunks[0].partial_index, rc.coord[0] * 2 + rc.coord[2]) << "rank " << rc.rank;
    EXPECT_EQ(rc.chunks[0].box, Box({2 * rc.coord[1]}, {2}));
  }
  ExpectInvalid(FromText(Mesh({2, 2}), {4}, "P(sum),P(max)").status(), "mix partial reduce ops");
}

TEST(FromPlacementsTest, PermutedMeshRanks) {
  Layout l = MustPlace(Mesh({2, 2}, {3, 9, 0, 4}), {4, 4}, "S(0),S(1)");
  EXPECT_EQ(l.RankIds(), (std::vector<int64_t>{3, 9, 0, 4}));
  EXPECT_EQ(OnlyChunk(l, 3).box, Box({0, 0}, {2, 2}));
  EXPECT_EQ(OnlyChunk(l, 9).box, Box({0, 2}, {2, 2}));
  EXPECT_EQ(OnlyChunk(l, 0).box, Box({2, 0}, {2, 2}));
  EXPECT_EQ(OnlyChunk(l, 4).box, Box({2, 2}, {2, 2}));
  EXPECT_EQ(l.Find(1), nullptr);
  EXPECT_EQ(l.Find(0)->coord, (Shape{1, 0}));
}

TEST(FromPlacementsTest, RejectsMismatchedInputs) {
  ExpectInvalid(FromText(Mesh({2, 2}), {4}, "S(0)").status(), "have 1 items but");
  ExpectInvalid(Layout::FromPlacements(DeviceMesh(), {4}, {}).status(), "mesh is empty");
  ExpectInvalid(FromText(Mesh({2}), {4, -1}, "S(0)").status(), "negative dim 1");
}

TEST(ShapeOverflowTest, EveryConstructorRejectsOverflowingShapes) {
  const Shape huge = {int64_t{1} << 32, int64_t{1} << 32};
  ExpectInvalid(FromText(Mesh({2}), huge, "S(0)").status(), "overflows int64");
  ExpectInvalid(Layout::FromFlat(Mesh({1}), huge, FlatSpec{{}}).status(), "overflows int64");
  ExpectInvalid(Layout::FromChunks(huge, {}).status(), "overflows int64");
  ExpectInvalid(ValidateLayout(huge, {}), "overflows int64");
  ExpectInvalid(ValidateLayout({kMax, 2}, {}), "overflows int64");
}

// ---------------------------------------------------------------------------------------
// FromFlat and FlatRangeToBoxes.

TEST(FromFlatTest, OlmoStyleSpec) {
  absl::StatusOr<FlatSpec> spec = ParseFlatSpec("0:4,20:30;4:20;;");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<Layout> l = Layout::FromFlat(Mesh({4}), {6, 5}, *spec);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->ranks().size(), 4u);
  const RankChunks& r0 = l->ranks()[0];
  EXPECT_EQ(r0.rank, 0);
  EXPECT_EQ(r0.local_elements, 14);
  ASSERT_EQ(r0.chunks.size(), 2u);
  EXPECT_EQ(r0.chunks[0], (Chunk{Box({0, 0}, {1, 4}), 0, 0}));
  EXPECT_EQ(r0.chunks[1], (Chunk{Box({4, 0}, {2, 5}), 4, 0}));
  const RankChunks& r1 = l->ranks()[1];
  EXPECT_EQ(r1.local_elements, 16);
  ASSERT_EQ(r1.chunks.size(), 2u);
  EXPECT_EQ(r1.chunks[0], (Chunk{Box({0, 4}, {1, 1}), 0, 0}));
  EXPECT_EQ(r1.chunks[1], (Chunk{Box({1, 0}, {3, 5}), 1, 0}));
  for (int r = 2; r < 4; ++r) {
    EXPECT_TRUE(l->ranks()[r].chunks.empty());
    EXPECT_EQ(l->ranks()[r].local_elements, 0);
  }
  EXPECT_EQ(l->SpecString(), "flat 0:4,20:30;4:20;; on mesh 4");
  ASSERT_TRUE(l->flat_spec().has_value());
  EXPECT_EQ(*l->flat_spec(), *spec);
  ASSERT_TRUE(l->mesh().has_value());
  EXPECT_TRUE(l->placements().empty());
}

TEST(FromFlatTest, RangesFollowMeshOrderAndKeepTheirOrderLocally) {
  // Ranges of a rank are concatenated in the order given, not sorted.
  absl::StatusOr<Layout> l =
      Layout::FromFlat(Mesh({2}, {5, 2}), {2, 3}, FlatSpec{{{3, 6}, {0, 1}}, {{1, 3}}});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->RankIds(), (std::vector<int64_t>{5, 2}));
  const RankChunks* r5 = l->Find(5);
  ASSERT_EQ(r5->chunks.size(), 2u);
  EXPECT_EQ(r5->chunks[0], (Chunk{Box({1, 0}, {1, 3}), 0, 0}));
  EXPECT_EQ(r5->chunks[1], (Chunk{Box({0, 0}, {1, 1}), 3, 0}));
  EXPECT_EQ(l->Find(2)->chunks[0], (Chunk{Box({0, 1}, {1, 2}), 0, 0}));
}

TEST(FromFlatTest, Rejections) {
  const DeviceMesh m = Mesh({2});
  ExpectInvalid(Layout::FromFlat(m, {6, 5}, FlatSpec{{{0, 30}}}).status(),
                "flat spec has 1 rank groups but");
  ExpectInvalid(Layout::FromFlat(m, {6, 5}, FlatSpec{{{0, 20}}, {{20, 31}}}).status(),
                "flat range 20:31 of rank 1 is outside the flattened tensor [0, 30)");
  ExpectInvalid(Layout::FromFlat(m, {6, 5}, FlatSpec{{{-1, 20}}, {{20, 30}}}).status(),
                "flat range -1:20 of rank 0");
  ExpectInvalid(Layout::FromFlat(m, {6, 5}, FlatSpec{{{0, 20}}, {{25, 20}}}).status(),
                "flat range 25:20");
  // Overlap between ranks and within one rank.
  absl::Status across = Layout::FromFlat(m, {6, 5}, FlatSpec{{{0, 16}}, {{12, 30}}}).status();
  ExpectInvalid(across, "overlaps");
  EXPECT_THAT(std::string(across.message()), HasSubstr("rank 0"));
  EXPECT_THAT(std::string(across.message()), HasSubstr("rank 1"));
  ExpectInvalid(Layout::FromFlat(m, {6, 5}, FlatSpec{{{0, 16}, {10, 12}}, {{16, 30}}}).status(),
                "overlaps");
  // Gaps.
  ExpectInvalid(Layout::FromFlat(m, {6, 5}, FlatSpec{{{0, 10}}, {{11, 30}}}).status(),
                "chunks cover 29 of the 30 elements");
}

TEST(FromFlatTest, EmptyTensorAndScalar) {
  absl::StatusOr<Layout> empty = Layout::FromFlat(Mesh({2}), {3, 0}, FlatSpec{{{0, 0}}, {}});
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->ranks()[0].chunks.empty());
  absl::StatusOr<Layout> scalar = Layout::FromFlat(Mesh({2}), {}, FlatSpec{{}, {{0, 1}}});
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  ASSERT_EQ(scalar->ranks()[1].chunks.size(), 1u);
  EXPECT_EQ(scalar->ranks()[1].chunks[0].box, Box({}, {}));
  EXPECT_EQ(scalar->ranks()[1].local_elements, 1);
}

// Flat index of every element of `box` in row-major order over the box, as flat indices
// of the tensor.
std::vector<int64_t> FlatIndices(const Shape& shape, const Box& box) {
  std::vector<int64_t> out;
  const Shape strides = RowMajorStrides(shape);
  if (box.Empty()) return out;
  Shape idx(box.ndim(), 0);
  while (true) {
    int64_t flat = 0;
    for (int d = 0; d < box.ndim(); ++d) flat += (box.offset(d) + idx[d]) * strides[d];
    out.push_back(flat);
    int d = box.ndim() - 1;
    while (d >= 0 && ++idx[d] == box.shape(d)) idx[d--] = 0;
    if (d < 0) break;
  }
  return out;
}

TEST(FlatRangeToBoxesTest, ExhaustiveOnSmallShapes) {
  for (const Shape& shape :
       {Shape{7}, Shape{1}, Shape{3, 4}, Shape{1, 5}, Shape{4, 1}, Shape{2, 3, 4}, Shape{2, 1, 3},
        Shape{3, 3, 3}, Shape{1, 1, 2}, Shape{4, 2, 1}}) {
    const int64_t numel = Box::Whole(shape).Volume();
    const size_t max_boxes = 2 * shape.size() - 1;
    for (int64_t a = 0; a <= numel; ++a) {
      for (int64_t b = a; b <= numel; ++b) {
        const std::vector<Box> boxes = FlatRangeToBoxes(shape, a, b);
        SCOPED_TRACE(ShapeToString(shape) + " [" + std::to_string(a) + ", " + std::to_string(b) +
                     ")");
        ASSERT_LE(boxes.size(), max_boxes);
        if (a == b) ASSERT_TRUE(boxes.empty());
        // Concatenating each box's elements in row-major order gives exactly a, a+1, ...,
        // b-1: boxes are non-empty, in bounds, disjoint, each contiguous, in flat order,
        // and they cover [a, b).
        int64_t next = a;
        for (const Box& box : boxes) {
          ASSERT_TRUE(box.InBounds(shape)) << box.ToString();
          ASSERT_FALSE(box.Empty()) << box.ToString();
          for (int64_t f : FlatIndices(shape, box)) ASSERT_EQ(f, next++) << box.ToString();
        }
        ASSERT_EQ(next, b);
      }
    }
  }
}

TEST(FlatRangeToBoxesTest, HeadMiddleAndTailBoxes) {
  // [1, 23) of (2,3,4): tail of row (0,0), rest of plane 0, head of plane 1, up to (1,2,3).
  const std::vector<Box> boxes = FlatRangeToBoxes({2, 3, 4}, 1, 23);
  EXPECT_EQ(boxes, (std::vector<Box>{Box({0, 0, 1}, {1, 1, 3}), Box({0, 1, 0}, {1, 2, 4}),
                                     Box({1, 0, 0}, {1, 2, 4}), Box({1, 2, 0}, {1, 1, 3})}));
  // With three planes a range can need all 2*3-1 boxes.
  EXPECT_EQ(FlatRangeToBoxes({3, 3, 4}, 5, 30),
            (std::vector<Box>{Box({0, 1, 1}, {1, 1, 3}), Box({0, 2, 0}, {1, 1, 4}),
                              Box({1, 0, 0}, {1, 3, 4}), Box({2, 0, 0}, {1, 1, 4}),
                              Box({2, 1, 0}, {1, 1, 2})}));
  EXPECT_EQ(FlatRangeToBoxes({2, 3, 4}, 0, 24), (std::vector<Box>{Box({0, 0, 0}, {2, 3, 4})}));
  EXPECT_EQ(FlatRangeToBoxes({}, 0, 1), (std::vector<Box>{Box({}, {})}));
}

TEST(FlatRangeToBoxesTest, RangesOutsideTheTensorGiveNothing) {
  EXPECT_TRUE(FlatRangeToBoxes({3, 0}, 0, 2).empty());  // Would divide by a zero stride.
  EXPECT_TRUE(FlatRangeToBoxes({2, 3}, 4, 7).empty());
  EXPECT_TRUE(FlatRangeToBoxes({2, 3}, -1, 2).empty());
}

// ---------------------------------------------------------------------------------------
// ValidateLayout and FromChunks.

// Without `local_elements`, the buffer is just big enough for the chunks.
RankChunks RC(int64_t rank, std::vector<Chunk> chunks,
              std::optional<int64_t> local_elements = std::nullopt) {
  RankChunks rc;
  rc.rank = rank;
  if (!local_elements.has_value()) {
    local_elements = 0;
    for (const Chunk& c : chunks) {
      local_elements = std::max(*local_elements, c.local_offset + c.box.Volume());
    }
  }
  rc.local_elements = *local_elements;
  rc.chunks = std::move(chunks);
  return rc;
}

Chunk C(Shape offset, Shape shape, int64_t local_offset = 0, int64_t partial_index = 0) {
  return Chunk{Box(std::move(offset), std::move(shape)), local_offset, partial_index};
}

TEST(ValidateLayoutTest, AcceptsAPartition) {
  EXPECT_TRUE(
      ValidateLayout({4, 4}, {RC(0, {C({0, 0}, {2, 4})}), RC(1, {C({2, 0}, {2, 4})})}).ok());
  // One rank, two chunks at distinct local offsets, plus a rank with nothing.
  EXPECT_TRUE(
      ValidateLayout({4, 4}, {RC(3, {C({2, 0}, {2, 4}, 8), C({0, 0}, {2, 4}, 0)}), RC(1, {})})
          .ok());
  // Empty chunks may sit anywhere in bounds, even at the end of the local buffer.
  EXPECT_TRUE(ValidateLayout({4}, {RC(0, {C({0}, {4}), C({4}, {0}, 4)})}).ok());
  EXPECT_TRUE(ValidateLayout({0, 3}, {}).ok());
}

TEST(ValidateLayoutTest, OutOfBounds) {
  ExpectInvalid(ValidateLayout({4, 4}, {RC(0, {C({0, 0}, {4, 4})}), RC(1, {C({3, 0}, {2, 4})})}),
                "rank 1 chunk [3:5, 0:4] is out of bounds of tensor [4, 4]");
  ExpectInvalid(ValidateLayout({4, 4}, {RC(0, {C({-1, 0}, {1, 4})})}), "out of bounds");
  ExpectInvalid(ValidateLayout({4, 4}, {RC(0, {C({0, 0}, {4, -1})})}), "out of bounds");
  ExpectInvalid(ValidateLayout({4, 4}, {RC(0, {C({0}, {4})})}), "out of bounds");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({5}, {0})}, 0)}), "rank 0 chunk [5:5]");
  // Offsets near int64 max must not overflow in the check or in the message.
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({kMax}, {1})}, 1)}),
                "rank 0 chunk [9223372036854775807:9223372036854775807+1] is out of bounds");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({2}, {kMax})}, 1)}), "out of bounds");
}

TEST(ValidateLayoutTest, OverlapNamesBothRanksAndBoxes) {
  absl::Status s =
      ValidateLayout({4, 4}, {RC(0, {C({0, 0}, {3, 4})}), RC(1, {C({2, 0}, {2, 4})}), RC(2, {})});
  ExpectInvalid(s, "overlaps");
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 0 chunk [0:3, 0:4]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 chunk [2:4, 0:4]"));
  // Overlap of two chunks of one rank (at distinct local offsets) is rejected too.
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {3}, 0), C({2}, {2}, 3)})}), "overlaps");
  // A box nested inside another.
  ExpectInvalid(ValidateLayout({4, 4}, {RC(0, {C({0, 0}, {4, 4})}), RC(1, {C({1, 1}, {1, 1})})}),
                "overlaps");
}

TEST(ValidateLayoutTest, IdenticalReplicasAreAllowed) {
  EXPECT_TRUE(ValidateLayout({4, 4}, {RC(0, {C({0, 0}, {2, 4})}), RC(1, {C({2, 0}, {2, 4})}),
                                      RC(2, {C({0, 0}, {2, 4})}), RC(3, {C({2, 0}, {2, 4})})})
                  .ok());
  EXPECT_TRUE(ValidateLayout({}, {RC(0, {C({}, {})}), RC(1, {C({}, {})})}).ok());
  // But one rank may not hold the same box twice.
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {4}, 0), C({0}, {4}, 4)})}),
                "rank 0 holds chunk [0:4] twice");
}

TEST(ValidateLayoutTest, IncompleteCoverage) {
  ExpectInvalid(ValidateLayout({4, 4}, {RC(0, {C({0, 0}, {2, 4})}), RC(1, {C({2, 0}, {1, 4})})}),
                "chunks cover 12 of the 16 elements of tensor [4, 4]");
  ExpectInvalid(ValidateLayout({4}, {}), "chunks cover 0 of the 4 elements");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {0})})}), "chunks cover 0 of the 4");
}

TEST(ValidateLayoutTest, DuplicateAndNegativeRanks) {
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {2})}), RC(0, {C({2}, {2})})}),
                "rank 0 is listed twice");
  ExpectInvalid(ValidateLayout({4}, {RC(-1, {C({0}, {4})})}), "rank -1 < 0");
}

TEST(ValidateLayoutTest, LocalBuffer) {
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {2}, 0), C({2}, {2}, 1)})}),
                "rank 0 has two chunks sharing local elements [1, 2)");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {4}, 1)}, 4)}),
                "rank 0 chunk [0:4] at local offset 1 does not fit its local buffer of 4");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {4}, -1)}, 4)}), "at local offset -1");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {4}, kMax)}, 4)}), "does not fit");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {4}, 0)}, -5)}),
                "rank 0 local buffer of -5 elements is negative");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {4}, std::numeric_limits<int64_t>::min())},
                                        std::numeric_limits<int64_t>::min())}),
                "negative");
  // A gap in the local buffer is fine.
  EXPECT_TRUE(ValidateLayout({4}, {RC(0, {C({0}, {2}, 0), C({2}, {2}, 5)}, 9)}).ok());
}

TEST(ValidateLayoutTest, PartialIndex) {
  const std::vector<RankChunks> two = {RC(0, {C({0}, {4}, 0, 0)}), RC(1, {C({0}, {4}, 0, 1)})};
  EXPECT_TRUE(ValidateLayout({4}, two, 2).ok());
  ExpectInvalid(ValidateLayout({4}, two, 1),
                "rank 1 chunk [0:4] has partial index 1 outside [0, 1)");
  ExpectInvalid(ValidateLayout({4}, {RC(0, {C({0}, {4}, 0, -1)})}, 2), "partial index -1");
  ExpectInvalid(ValidateLayout({4}, two, 3),
                "chunks cover 0 of the 4 elements of tensor [4] "
                "(partial contribution 2)");
  ExpectInvalid(ValidateLayout({4}, two, 0), "num_partials 0 < 1");
  // A huge partial count must be answered, not allocated.
  ExpectInvalid(ValidateLayout({4}, two, int64_t{1} << 62), "(partial contribution 2)");
  EXPECT_TRUE(ValidateLayout({0}, {}, int64_t{1} << 62).ok());
  // Overlap is checked per contribution.
  ExpectInvalid(
      ValidateLayout(
          {4}, {RC(0, {C({0}, {4}, 0, 0)}), RC(1, {C({0}, {3}, 0, 1)}), RC(2, {C({2}, {2}, 0, 1)})},
          2),
      "overlaps");
}

TEST(FromChunksTest, ValidatesAndKeepsMetadata) {
  absl::StatusOr<Layout> l = Layout::FromChunks(
      {4}, {RC(7, {C({0}, {4}, 0, 0)}), RC(2, {C({0}, {4}, 0, 1)})}, 2, ReduceOp::kAvg);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->RankIds(), (std::vector<int64_t>{7, 2}));
  EXPECT_EQ(l->num_partials(), 2);
  EXPECT_EQ(l->partial_op(), ReduceOp::kAvg);
  EXPECT_EQ(l->Find(2)->chunks[0].partial_index, 1);
  EXPECT_EQ(l->Find(3), nullptr);
  EXPECT_FALSE(l->mesh().has_value());
  EXPECT_EQ(l->SpecString(), "chunks on 2 ranks");
  ExpectInvalid(Layout::FromChunks({4}, {RC(0, {C({0}, {3})})}).status(), "cover 3 of the 4");
}

TEST(LayoutTest, EqualityAndFingerprint) {
  Layout a = MustPlace(Mesh({2}), {4}, "S(0)");
  absl::StatusOr<Layout> b = Layout::FromFlat(Mesh({2}), {4}, FlatSpec{{{0, 2}}, {{2, 4}}});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a, *b);  // Same chunks, however they were specified.
  Layout c = MustPlace(Mesh({2}), {4}, "R");
  EXPECT_FALSE(a == c);
  EXPECT_NE(a.Fingerprint(), c.Fingerprint());
  EXPECT_NE(MustPlace(Mesh({2}, {1, 0}), {4}, "S(0)").Fingerprint(), a.Fingerprint());
  absl::StatusOr<Layout> d = Layout::FromFlat(Mesh({2}), {4}, FlatSpec{{{0, 1}}, {{1, 4}}});
  ASSERT_TRUE(d.ok());
  EXPECT_NE(b->Fingerprint(), d->Fingerprint());
  EXPECT_FALSE(*b == *d);
}

}  // namespace
}  // namespace shardcoord
