#include "sharding/tensor_split.h"

#include <algorithm>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/box_copy.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::ForEachIndex;
using ::testing::HasSubstr;

}  // namespace

// Readable failure messages for boxes.
void PrintTo(const Box& box, std::ostream* os) { *os << box.ToString(); }

namespace {

Layout PlacementLayout(const Shape& mesh_shape, const Shape& global, const std::string& spec) {
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(mesh_shape);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<std::vector<Placement>> placements = ParsePlacements(spec);
  EXPECT_TRUE(placements.ok()) << placements.status();
  absl::StatusOr<Layout> layout = Layout::FromPlacements(*mesh, global, *placements);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

Layout FlatLayout(int64_t nranks, const Shape& global, const FlatSpec& spec) {
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({nranks});
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<Layout> layout = Layout::FromFlat(*mesh, global, spec);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

std::vector<char> RandomBytes(std::mt19937_64& rng, int64_t n) {
  std::vector<char> v(n);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

// A mixed bag of layouts: replicated, uneven, empty shards, flat ranges crossing rows,
// several chunks per rank.
std::vector<Layout> TestLayouts() {
  std::vector<Layout> out;
  out.push_back(PlacementLayout({2, 2}, {8, 6}, "S(0),R"));
  out.push_back(PlacementLayout({4}, {6, 10}, "S(1)"));
  out.push_back(PlacementLayout({2, 3}, {5, 7}, "S(0),S(1)"));
  out.push_back(PlacementLayout({3}, {8, 3}, "S(0,[3,1,4])"));
  out.push_back(PlacementLayout({4}, {2, 5}, "S(0)"));  // torch.chunk: 1, 1, 0, 0 rows.
  out.push_back(PlacementLayout({2, 2}, {4, 3, 5}, "S(2),S(0)"));
  out.push_back(FlatLayout(3, {5, 7}, {{{0, 10}, {30, 35}}, {{10, 30}}, {}}));
  out.push_back(FlatLayout(2, {3, 4, 5}, {{{7, 41}}, {{0, 7}, {41, 60}}}));
  return out;
}

TEST(ChunkUnshardedTest, KnownBuffers) {
  std::vector<int32_t> full(8);
  for (int i = 0; i < 8; ++i) full[i] = i;
  auto as_ints = [](const std::vector<char>& b) {
    std::vector<int32_t> v(b.size() / 4);
    std::memcpy(v.data(), b.data(), b.size());
    return v;
  };
  absl::StatusOr<std::vector<std::vector<char>>> rows =
      ChunkUnsharded(PlacementLayout({2}, {4, 2}, "S(0)"), full.data(), 4);
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ(as_ints((*rows)[0]), (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(as_ints((*rows)[1]), (std::vector<int32_t>{4, 5, 6, 7}));

  absl::StatusOr<std::vector<std::vector<char>>> cols =
      ChunkUnsharded(PlacementLayout({2}, {2, 4}, "S(1)"), full.data(), 4);
  ASSERT_TRUE(cols.ok()) << cols.status();
  EXPECT_EQ(as_ints((*cols)[0]), (std::vector<int32_t>{0, 1, 4, 5}));
  EXPECT_EQ(as_ints((*cols)[1]), (std::vector<int32_t>{2, 3, 6, 7}));

  // Flat: rank 0 holds elements 5..7 then 0..1, in that order.
  absl::StatusOr<std::vector<std::vector<char>>> flat =
      ChunkUnsharded(FlatLayout(2, {2, 4}, {{{5, 8}, {0, 2}}, {{2, 5}}}), full.data(), 4);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(as_ints((*flat)[0]), (std::vector<int32_t>{5, 6, 7, 0, 1}));
  EXPECT_EQ(as_ints((*flat)[1]), (std::vector<int32_t>{2, 3, 4}));
}

TEST(ChunkUnshardedTest, RoundTripsThroughAssembleFull) {
  std::mt19937_64 rng(1234);
  for (const Layout& layout : TestLayouts()) {
    for (int64_t es : {4, 3}) {
      const std::vector<char> full = RandomBytes(rng, layout.num_elements() * es);
      absl::StatusOr<std::vector<std::vector<char>>> bufs = ChunkUnsharded(layout, full.data(), es);
      ASSERT_TRUE(bufs.ok()) << bufs.status();
      ASSERT_EQ(bufs->size(), layout.ranks().size());
      std::vector<const void*> ptrs;
      for (size_t i = 0; i < bufs->size(); ++i) {
        const RankChunks& rc = layout.ranks()[i];
        EXPECT_EQ(static_cast<int64_t>((*bufs)[i].size()), rc.local_elements * es);
        // Every chunk element sits where the chunk metadata says.
        for (const Chunk& c : rc.chunks) {
          int64_t k = 0;
          ForEachIndex(c.box, [&](const Shape& idx) {
            int64_t lin = 0;
            for (int d = 0; d < layout.ndim(); ++d) lin = lin * layout.global_shape()[d] + idx[d];
            ASSERT_EQ(std::memcmp((*bufs)[i].data() + (c.local_offset + k) * es,
                                  full.data() + lin * es, es),
                      0);
            ++k;
          });
        }
        absl::StatusOr<std::vector<char>> one = ShardedChunk(layout, rc.rank, full.data(), es);
        ASSERT_TRUE(one.ok()) << one.status();
        EXPECT_EQ(*one, (*bufs)[i]);
        ptrs.push_back((*bufs)[i].empty() ? nullptr : (*bufs)[i].data());
      }
      std::vector<char> back(full.size(), 0);
      ASSERT_TRUE(AssembleFull(layout, ptrs, es, back.data()).ok()) << layout.SpecString();
      EXPECT_EQ(back, full) << layout.SpecString();
    }
  }
}

TEST(ChunkUnshardedTest, PartialLayoutsReduceBackToTheValue) {
  std::vector<float> full = {1, 2, 3, 4, 5, 6};
  for (const char* spec : {"P(sum),S(1)", "P(max),S(1)"}) {
    const Layout layout = PlacementLayout({2, 2}, {2, 3}, spec);
    absl::StatusOr<std::vector<std::vector<char>>> bufs = ChunkUnsharded(layout, full.data(), 4);
    ASSERT_TRUE(bufs.ok()) << bufs.status();
    // Reduce the partial contributions of each column piece: rank j and rank 2 + j.
    for (int j = 0; j < 2; ++j) {
      const Chunk& c = layout.ranks()[j].chunks[0];
      std::vector<char> acc = (*bufs)[j];
      ASSERT_TRUE(ReduceIntoBox(c.box, (*bufs)[2 + j].data(), c.box, acc.data(), c.box, DType::kF32,
                                layout.partial_op())
                      .ok());
      std::vector<char> want(acc.size());
      ASSERT_TRUE(PackBox(c.box, full.data(), Box::Whole({2, 3}), want.data(), 4).ok());
      EXPECT_EQ(acc, want) << spec << " piece " << j;
    }
    std::vector<float> back(6);
    absl::Status s = AssembleFull(
        layout, {(*bufs)[0].data(), (*bufs)[1].data(), (*bufs)[2].data(), (*bufs)[3].data()}, 4,
        back.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("partial"));
  }
  // With sum, contribution 1 is all zeros.
  const Layout sum = PlacementLayout({2, 2}, {2, 3}, "P(sum),S(1)");
  absl::StatusOr<std::vector<char>> zeros = ShardedChunk(sum, 3, full.data(), 4);
  ASSERT_TRUE(zeros.ok());
  EXPECT_EQ(*zeros, std::vector<char>(zeros->size(), 0));
}

TEST(ChunkUnshardedTest, Errors) {
  const Layout layout = PlacementLayout({2}, {4, 2}, "S(0)");
  std::vector<char> full(32);
  EXPECT_EQ(ShardedChunk(layout, 7, full.data(), 4).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ChunkUnsharded(layout, full.data(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status s = AssembleFull(layout, {full.data()}, 4, full.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("1 local buffers"));
  std::vector<char> out(32);
  s = AssembleFull(layout, {full.data(), nullptr}, 4, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 1"));
}

// Index of the chunk of `rc` that contains `box` with the same partial index, or -1.
int SourceChunk(const RankChunks& rc, const Box& box, int64_t partial_index) {
  for (size_t k = 0; k < rc.chunks.size(); ++k) {
    if (rc.chunks[k].partial_index == partial_index && rc.chunks[k].box.Contains(box)) {
      return static_cast<int>(k);
    }
  }
  return -1;
}

// Checks SplitLayout(layout, dim, sections) against brute force: element sets per rank,
// packing, chunk order, and the bytes each rank would hold.
void CheckSplit(const Layout& layout, int dim, const std::vector<int64_t>& sections) {
  SCOPED_TRACE(
      absl::StrCat(layout.SpecString(), " dim ", dim, " sections ", ShapeToString(sections)));
  absl::StatusOr<std::vector<Layout>> pieces = SplitLayout(layout, dim, sections);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), sections.size());
  const int d = dim < 0 ? dim + layout.ndim() : dim;
  const int64_t es = 3;
  std::mt19937_64 rng(42);
  const std::vector<char> full = RandomBytes(rng, layout.num_elements() * es);
  absl::StatusOr<std::vector<std::vector<char>>> orig = ChunkUnsharded(layout, full.data(), es);
  ASSERT_TRUE(orig.ok());
  int64_t start = 0;
  for (size_t i = 0; i < sections.size(); ++i) {
    const Layout& piece = (*pieces)[i];
    Shape want_shape = layout.global_shape();
    want_shape[d] = sections[i];
    EXPECT_EQ(piece.global_shape(), want_shape);
    EXPECT_TRUE(ValidateLayout(piece.global_shape(), piece.ranks(), piece.num_partials()).ok());
    EXPECT_EQ(piece.num_partials(), layout.num_partials());
    EXPECT_EQ(piece.partial_op(), layout.partial_op());
    EXPECT_EQ(piece.RankIds(), layout.RankIds());
    ASSERT_EQ(piece.ranks().size(), layout.ranks().size());

    Shape piece_off(layout.ndim(), 0), piece_shp = layout.global_shape();
    piece_off[d] = start;
    piece_shp[d] = sections[i];
    const Box piece_box(piece_off, piece_shp);
    std::vector<char> piece_full(piece_box.Volume() * es);
    ASSERT_TRUE(
        PackBox(piece_box, full.data(), Box::Whole(layout.global_shape()), piece_full.data(), es)
            .ok());
    absl::StatusOr<std::vector<std::vector<char>>> piece_bufs =
        ChunkUnsharded(piece, piece_full.data(), es);
    ASSERT_TRUE(piece_bufs.ok());

    for (size_t r = 0; r < layout.ranks().size(); ++r) {
      const RankChunks& src = layout.ranks()[r];
      const RankChunks& got = piece.ranks()[r];
      // Element sets: every (partial, global index) of the rank inside the piece, once.
      std::vector<std::pair<int64_t, Shape>> want_elems, got_elems;
      for (const Chunk& c : src.chunks) {
        ForEachIndex(c.box, [&](const Shape& idx) {
          if (idx[d] >= start && idx[d] < start + sections[i]) {
            want_elems.emplace_back(c.partial_index, idx);
          }
        });
      }
      int64_t packed = 0;
      int last_source = -1;
      std::vector<char> want_buf(got.local_elements * es);
      for (const Chunk& c : got.chunks) {
        EXPECT_FALSE(c.box.Empty());
        EXPECT_EQ(c.local_offset, packed);
        packed += c.box.Volume();
        Shape global_off = c.box.offset();
        global_off[d] += start;
        const Box global(global_off, c.box.shape());
        ForEachIndex(global,
                     [&](const Shape& idx) { got_elems.emplace_back(c.partial_index, idx); });
        // Each piece chunk is the whole intersection of one source chunk, in source order.
        const int k = SourceChunk(src, global, c.partial_index);
        ASSERT_GE(k, 0) << global.ToString();
        EXPECT_GT(k, last_source);
        last_source = k;
        EXPECT_EQ(src.chunks[k].box.Intersect(piece_box), global);
        const Chunk& sc = src.chunks[k];
        ASSERT_TRUE(CopyBox(global, (*orig)[r].data() + sc.local_offset * es, sc.box,
                            want_buf.data() + c.local_offset * es, global, es)
                        .ok());
      }
      EXPECT_EQ(got.local_elements, packed);
      std::sort(want_elems.begin(), want_elems.end());
      std::sort(got_elems.begin(), got_elems.end());
      EXPECT_EQ(got_elems, want_elems) << "rank " << src.rank;
      // What the rank would cut out of its own buffer is what chunking the piece gives.
      EXPECT_EQ((*piece_bufs)[r], want_buf) << "rank " << src.rank;
    }
    start += sections[i];
  }
}

TEST(SplitLayoutTest, MatchesBruteForce) {
  const std::vector<Layout> layouts = TestLayouts();
  CheckSplit(layouts[0], 0, {3, 5});  // S(0),R: one piece straddles the shard boundary.
  CheckSplit(layouts[0], 1, {1, 2, 3});
  CheckSplit(layouts[1], 1, {4, 6});  // S(1)
  CheckSplit(layouts[1], 0, {6});
  CheckSplit(layouts[2], -1, {2, 0, 5});  // A zero-size piece.
  CheckSplit(layouts[3], 0, {2, 2, 4});   // Uneven S(0,[3,1,4]).
  CheckSplit(layouts[4], 1, {2, 3});      // Empty shards.
  CheckSplit(layouts[5], 2, {2, 2, 1});
  CheckSplit(layouts[5], 1, {1, 1, 1});
  CheckSplit(layouts[6], 0, {1, 3, 1});  // Flat ranges crossing rows.
  CheckSplit(layouts[6], 1, {3, 4});
  CheckSplit(layouts[7], 1, {1, 2, 1});
  CheckSplit(layouts[7], 2, {5});
  CheckSplit(PlacementLayout({2, 2}, {4, 6}, "P(sum),S(1)"), 1, {3, 3});
  CheckSplit(PlacementLayout({2, 2}, {4, 6}, "S(0),P(avg)"), 0, {1, 3});
}

TEST(SplitLayoutTest, KnownPiecesForShardedRows) {
  // S(0),R on 2x2 over [8, 6], spelled out: ranks 0, 1 hold rows 0:4, ranks 2, 3 rows 4:8.
  std::vector<RankChunks> ranks;
  for (int64_t r = 0; r < 4; ++r) {
    ranks.push_back(RankChunks{r, {}, {Chunk{Box({r < 2 ? 0 : 4, 0}, {4, 6}), 0, 0}}, 24});
  }
  absl::StatusOr<Layout> built = Layout::FromChunks({8, 6}, ranks);
  ASSERT_TRUE(built.ok()) << built.status();
  const Layout& layout = *built;
  absl::StatusOr<std::vector<Layout>> pieces = SplitLayout(layout, 0, {3, 5});
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  const Layout& p0 = (*pieces)[0];
  const Layout& p1 = (*pieces)[1];
  ASSERT_EQ(p0.Find(0)->chunks.size(), 1u);
  EXPECT_EQ(p0.Find(0)->chunks[0].box, Box({0, 0}, {3, 6}));
  EXPECT_TRUE(p0.Find(2)->chunks.empty());
  EXPECT_EQ(p0.Find(2)->local_elements, 0);
  EXPECT_EQ(p1.Find(1)->chunks[0].box, Box({0, 0}, {1, 6}));
  EXPECT_EQ(p1.Find(3)->chunks[0].box, Box({1, 0}, {4, 6}));
  EXPECT_EQ(p1.Find(3)->local_elements, 24);
}

TEST(SplitLayoutTest, SplitEvery) {
  const Layout layout = PlacementLayout({2}, {8, 6}, "S(1)");
  absl::StatusOr<std::vector<Layout>> pieces = SplitLayoutEvery(layout, 1, 4);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 2u);
  EXPECT_EQ((*pieces)[0].global_shape(), (Shape{8, 4}));
  EXPECT_EQ((*pieces)[1].global_shape(), (Shape{8, 2}));
  // Rank 1 holds columns 3:6: column 3 of piece 0 and columns 0:2 of piece 1.
  EXPECT_EQ((*pieces)[0].Find(1)->chunks[0].box, Box({0, 3}, {8, 1}));
  EXPECT_EQ((*pieces)[1].Find(1)->chunks[0].box, Box({0, 0}, {8, 2}));
  EXPECT_TRUE((*pieces)[1].Find(0)->chunks.empty());

  pieces = SplitLayoutEvery(layout, -2, 3);
  ASSERT_TRUE(pieces.ok());
  ASSERT_EQ(pieces->size(), 3u);
  EXPECT_EQ((*pieces)[2].global_shape(), (Shape{2, 6}));

  const Layout empty = PlacementLayout({2}, {0, 3}, "S(0)");
  pieces = SplitLayoutEvery(empty, 0, 2);
  ASSERT_TRUE(pieces.ok()) << pieces.status();
  ASSERT_EQ(pieces->size(), 1u);
  EXPECT_EQ((*pieces)[0].global_shape(), (Shape{0, 3}));
}

TEST(SplitLayoutTest, Errors) {
  const Layout layout = PlacementLayout({2}, {8, 6}, "S(0)");
  absl::Status s = SplitLayout(layout, 0, {3, 4}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("[3, 4]"));
  EXPECT_THAT(s.message(), HasSubstr("dim 0"));
  s = SplitLayout(layout, 1, {8, -2}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("-2"));
  s = SplitLayout(layout, 2, {8}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dim 2"));
  EXPECT_EQ(SplitLayout(layout, -3, {8}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SplitLayoutEvery(layout, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardcoord
