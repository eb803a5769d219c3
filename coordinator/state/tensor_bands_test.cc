#include "coordinator/state/tensor_bands.h"

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/box_copy.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/tensor_split.h"
#include "sharding/test_layouts.h"

namespace shardcoord {
namespace {

TEST(BandPlanTest, CutsDimZeroIntoBandsOfAtMostTheBudget) {
  // Rows of 4 f32 = 16 bytes; 40 bytes fit 2 rows.
  BandPlan plan({7, 4}, 4, 40);
  EXPECT_EQ(plan.rows_per_band(), 2);
  ASSERT_EQ(plan.num_bands(), 4);
  EXPECT_EQ(plan.band(0), Box({0, 0}, {2, 4}));
  EXPECT_EQ(plan.band(2), Box({4, 0}, {2, 4}));
  EXPECT_EQ(plan.band(3), Box({6, 0}, {1, 4}));
  EXPECT_EQ(plan.band_bytes(0), 32);
  EXPECT_EQ(plan.band_bytes(3), 16);
}

TEST(BandPlanTest, OneIndexPerBandWhenAnIndexIsLargerThanTheBudget) {
  BandPlan plan({3, 100}, 8, 16);
  EXPECT_EQ(plan.rows_per_band(), 1);
  EXPECT_EQ(plan.num_bands(), 3);
  EXPECT_EQ(plan.band_bytes(1), 800);
}

TEST(BandPlanTest, OneDimensionalTensorsAreCutByElements) {
  BandPlan plan({10}, 2, 6);
  EXPECT_EQ(plan.rows_per_band(), 3);
  ASSERT_EQ(plan.num_bands(), 4);
  EXPECT_EQ(plan.band(3), Box({9}, {1}));
}

TEST(BandPlanTest, WholeTensorInOneBandWhenItFits) {
  BandPlan plan({5, 2, 3}, 4, int64_t{1} << 40);
  EXPECT_EQ(plan.num_bands(), 1);
  EXPECT_EQ(plan.band(0), Box::Whole({5, 2, 3}));
}

TEST(BandPlanTest, ScalarIsOneBandAndEmptyTensorHasNone) {
  BandPlan scalar({}, 4, 1);
  ASSERT_EQ(scalar.num_bands(), 1);
  EXPECT_EQ(scalar.band(0), Box::Whole({}));
  EXPECT_EQ(scalar.band_bytes(0), 4);
  EXPECT_EQ(BandPlan({0, 4}, 4, 64).num_bands(), 0);
  EXPECT_EQ(BandPlan({4, 0}, 4, 64).num_bands(), 0);
}

TEST(ChooseSourcesTest, OneLiveReplicaPerChunkSpreadOverHolders) {
  // S(0),R on 2x2: ranks 0,1 hold rows 0:4, ranks 2,3 rows 4:8.
  const Layout layout = Placed({2, 2}, {8, 4}, "S(0),R");
  std::vector<BandSource> all = ChooseSources(layout, [](int64_t) { return true; });
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0], (BandSource{Box({0, 0}, {4, 4}), 0, 0}));
  EXPECT_EQ(all[1], (BandSource{Box({4, 0}, {4, 4}), 0, 2}));
  // Dead holders are skipped.
  std::vector<BandSource> some = ChooseSources(layout, [](int64_t r) { return r != 0 && r != 2; });
  ASSERT_EQ(some.size(), 2u);
  EXPECT_EQ(some[0].rank, 1);
  EXPECT_EQ(some[1].rank, 3);
}

TEST(ChooseSourcesTest, PartialContributionZeroComesFirst) {
  const Layout layout = Placed({2}, {4, 2}, "P(sum)");
  std::vector<BandSource> all = ChooseSources(layout, [](int64_t) { return true; });
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].partial_index, 0);
  EXPECT_EQ(all[1].partial_index, 1);
  EXPECT_EQ(all[0].box, Box::Whole({4, 2}));
}

TEST(BandReadsTest, EachBandReadsTheIntersectionFromTheChosenWorker) {
  // S(1) on 2 ranks: every band of rows reads a column half from each rank.
  const Layout layout = Placed({2}, {6, 4}, "S(1)");
  const std::vector<BandSource> sources = ChooseSources(layout, [](int64_t) { return true; });
  BandPlan plan({6, 4}, 4, 32);  // 2 rows per band.
  ASSERT_EQ(plan.num_bands(), 3);
  std::vector<BandSource> reads = BandReads(sources, plan.band(1));
  ASSERT_EQ(reads.size(), 2u);
  EXPECT_EQ(reads[0], (BandSource{Box({2, 0}, {2, 2}), 0, 0}));
  EXPECT_EQ(reads[1], (BandSource{Box({2, 2}, {2, 2}), 0, 1}));

  // S(0) on 3 ranks (2 rows each): band 1 = rows 2:4 lies on rank 1 only.
  const Layout rows = Placed({3}, {6, 4}, "S(0)");
  reads = BandReads(ChooseSources(rows, [](int64_t) { return true; }), plan.band(1));
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0], (BandSource{Box({2, 0}, {2, 4}), 0, 1}));
}

TEST(BandReadsTest, BandsReadEveryElementExactlyOncePerContribution) {
  const Layout layout = Placed({2, 2}, {7, 5}, "S(0),S(1)");
  const std::vector<BandSource> sources = ChooseSources(layout, [](int64_t) { return true; });
  BandPlan plan({7, 5}, 4, 40);  // 2 rows per band.
  int64_t total = 0;
  for (int64_t b = 0; b < plan.num_bands(); ++b) {
    for (const BandSource& r : BandReads(sources, plan.band(b))) {
      EXPECT_TRUE(plan.band(b).Contains(r.box));
      total += r.box.Volume();
    }
  }
  EXPECT_EQ(total, 35);
}

TEST(BandWritesTest, LocalOffsetsOfABandInAChunk) {
  // S(1) on 2: rank 1 holds [0:6, 2:4] at local offset 0, 2 elements per row.
  const Layout layout = Placed({2}, {6, 4}, "S(1)");
  BandPlan plan({6, 4}, 4, 32);
  std::vector<LocalWrite> w = BandWrites(*layout.Find(1), plan.band(2), false);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0], (LocalWrite{8, Box({4, 2}, {2, 2}), false}));
}

TEST(BandWritesTest, PartialSumContributionsOtherThanZeroAreZeros) {
  const Layout layout = Placed({2}, {4, 2}, "P(sum)");
  BandPlan plan({4, 2}, 4, 8);
  std::vector<LocalWrite> w0 = BandWrites(*layout.Find(0), plan.band(1), true);
  std::vector<LocalWrite> w1 = BandWrites(*layout.Find(1), plan.band(1), true);
  ASSERT_EQ(w0.size(), 1u);
  ASSERT_EQ(w1.size(), 1u);
  EXPECT_FALSE(w0[0].zeros);
  EXPECT_TRUE(w1[0].zeros);
  EXPECT_EQ(w1[0].local_offset, 2);
}

// Writing every band's pieces in order rebuilds exactly the local buffers ChunkUnsharded
// builds from the whole tensor, for layouts with several chunks per rank too.
void ExpectBandWritesRebuildLocalBuffers(const Layout& layout, int64_t band_bytes) {
  const Shape& shape = layout.global_shape();
  const int64_t es = 4;
  std::vector<float> full(Box::Whole(shape).Volume());
  std::iota(full.begin(), full.end(), 1.0f);
  absl::StatusOr<std::vector<std::vector<char>>> want = ChunkUnsharded(layout, full.data(), es);
  ASSERT_TRUE(want.ok()) << want.status();
  BandPlan plan(shape, es, band_bytes);
  ASSERT_TRUE(WritesInOrder(layout, plan));
  const bool zero_partials = layout.is_partial() && layout.partial_op() == ReduceOp::kSum;
  for (size_t i = 0; i < layout.ranks().size(); ++i) {
    const RankChunks& rc = layout.ranks()[i];
    std::vector<char> got(static_cast<size_t>(rc.local_elements * es), '\x7f');
    int64_t written = 0;  // Elements written front to back.
    for (int64_t b = 0; b < plan.num_bands(); ++b) {
      const Box band = plan.band(b);
      std::vector<char> band_data(static_cast<size_t>(band.Volume() * es));
      ASSERT_TRUE(PackBox(band, full.data(), Box::Whole(shape), band_data.data(), es).ok());
      for (const LocalWrite& w : BandWrites(rc, band, zero_partials)) {
        ASSERT_GE(w.local_offset, written) << "rank " << rc.rank << " band " << b;
        std::memset(got.data() + written * es, 0, (w.local_offset - written) * es);
        char* dst = got.data() + w.local_offset * es;
        if (w.zeros) {
          std::memset(dst, 0, w.box.Volume() * es);
        } else {
          ASSERT_TRUE(PackBox(w.box, band_data.data(), band, dst, es).ok());
        }
        written = w.local_offset + w.box.Volume();
      }
    }
    if (rc.local_elements > written) {  // memset on an empty buffer's null data is UB.
      std::memset(got.data() + written * es, 0, (rc.local_elements - written) * es);
    }
    EXPECT_EQ(got, (*want)[i]) << "rank " << rc.rank;
  }
}

TEST(BandWritesTest, RebuildLocalBuffersForEveryKindOfLayout) {
  for (int64_t band_bytes : {1, 16, 40, 100, 1 << 20}) {
    SCOPED_TRACE(band_bytes);
    ExpectBandWritesRebuildLocalBuffers(Placed({2, 2}, {7, 5}, "S(0),S(1)"), band_bytes);
    ExpectBandWritesRebuildLocalBuffers(Placed({2, 2}, {7, 5}, "S(1),R"), band_bytes);
    ExpectBandWritesRebuildLocalBuffers(Placed({2}, {7, 5}, "P(sum)"), band_bytes);
    ExpectBandWritesRebuildLocalBuffers(Placed({2}, {7, 5}, "P(avg)"), band_bytes);
    ExpectBandWritesRebuildLocalBuffers(Placed({3}, {7, 3, 2}, "S(2)"), band_bytes);
    ExpectBandWritesRebuildLocalBuffers(Placed({3}, {10}, "S(0)"), band_bytes);
    ExpectBandWritesRebuildLocalBuffers(Placed({3}, {10, 2}, "S(0,[5,0,5])"), band_bytes);
    absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({2});
    ASSERT_TRUE(mesh.ok());
    absl::StatusOr<FlatSpec> flat = ParseFlatSpec("0:13;13:30");
    ASSERT_TRUE(flat.ok()) << flat.status();
    absl::StatusOr<Layout> l = Layout::FromFlat(*mesh, {3, 2, 5}, *flat);
    ASSERT_TRUE(l.ok()) << l.status();
    ExpectBandWritesRebuildLocalBuffers(*l, band_bytes);
  }
}

TEST(BandWritesTest, ScalarIsReadAndWrittenAsItsOneBand) {
  const Layout layout = Placed({2}, {}, "R");
  BandPlan plan({}, 4, 1);
  std::vector<BandSource> reads =
      BandReads(ChooseSources(layout, [](int64_t) { return true; }), plan.band(0));
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].box, Box::Whole({}));
  std::vector<LocalWrite> w = BandWrites(*layout.Find(1), plan.band(0), false);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0], (LocalWrite{0, Box::Whole({}), false}));
  ExpectBandWritesRebuildLocalBuffers(layout, 1);
}

TEST(BandWritesTest, ChunksStoredAgainstDimZeroOrderAreNotStreamable) {
  // Rank 0 holds rows 2:4 first and rows 0:2 after them.
  RankChunks rc;
  rc.rank = 0;
  rc.chunks = {Chunk{Box({2, 0}, {2, 2}), 0, 0}, Chunk{Box({0, 0}, {2, 2}), 4, 0}};
  rc.local_elements = 8;
  absl::StatusOr<Layout> layout = Layout::FromChunks({4, 2}, {rc});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_FALSE(WritesInOrder(*layout, BandPlan({4, 2}, 4, 16)));
  // In one band they are (each band's writes go by local offset).
  EXPECT_TRUE(WritesInOrder(*layout, BandPlan({4, 2}, 4, 1 << 20)));
}

}  // namespace
}  // namespace shardcoord
