#include "sharding/block_staging.h"

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::ErrorOf;
using sharding_testing::ForEachIndex;
using sharding_testing::Mesh;
using ::testing::HasSubstr;

Layout Placed(Shape mesh, Shape shape, std::vector<Placement> placements) {
  absl::StatusOr<Layout> l = Layout::FromPlacements(Mesh(mesh), shape, placements);
  EXPECT_TRUE(l.ok()) << l.status();
  return l.ok() ? *l : Layout();
}

std::vector<std::vector<Box>> BoxesOf(const Layout& l) {
  std::vector<std::vector<Box>> out;
  for (const RankChunks& rc : l.ranks()) {
    std::vector<Box> boxes;
    for (const Chunk& c : rc.chunks) boxes.push_back(c.box);
    out.push_back(boxes);
  }
  return out;
}

// Every element covered exactly once, every chunk block-aligned, the scale chunks the blocks
// of their staging chunks, and every block inside one chunk.
void CheckInvariants(const BlockStagingPlan& p, const BlockSize& b) {
  const Shape& shape = p.staging.global_shape();
  std::vector<int> seen(static_cast<size_t>(p.staging.num_elements()), 0);
  for (const RankChunks& rc : p.staging.ranks()) {
    for (const Chunk& c : rc.chunks) {
      ForEachIndex(c.box, [&](const Shape& idx) {
        int64_t flat = 0;
        for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
        ++seen[flat];
      });
    }
  }
  for (int v : seen) ASSERT_EQ(v, 1);
  EXPECT_TRUE(IsBlockAligned(p.staging, b));
  ASSERT_EQ(p.staging.ranks().size(), p.scales.ranks().size());
  EXPECT_EQ(p.scales.global_shape(), *BlockScaleShape(shape, b));
  for (size_t r = 0; r < p.staging.ranks().size(); ++r) {
    const auto& sc = p.staging.ranks()[r].chunks;
    const auto& qc = p.scales.ranks()[r].chunks;
    ASSERT_EQ(sc.size(), qc.size());
    for (size_t i = 0; i < sc.size(); ++i) EXPECT_EQ(BlockBoxOf(sc[i].box, b), qc[i].box);
  }
}

TEST(BlockStagingTest, SourceAlreadyWholeStagesOntoItsOwnBoxes) {
  const BlockSize b{4, 8};
  for (const Layout& src :
       {Placed({4}, {32, 20}, {Placement::Shard(0)}), Placed({2}, {9, 32}, {Placement::Shard(1)}),
        Placed({2, 2}, {16, 32}, {Placement::Shard(0), Placement::Shard(1)})}) {
    absl::StatusOr<BlockStagingPlan> p = PlanBlockStaging(src, b);
    ASSERT_TRUE(p.ok()) << p.status();
    CheckInvariants(*p, b);
    EXPECT_EQ(BoxesOf(p->staging), BoxesOf(src)) << src.SpecString();
    EXPECT_EQ(p->cut_blocks, 0);
  }
}

TEST(BlockStagingTest, ReplicatedSourceStagesOnTheFirstRank) {
  const BlockSize b{4, 4};
  const Layout src = Placed({3}, {10, 10}, {Placement::Replicate()});
  absl::StatusOr<BlockStagingPlan> p = PlanBlockStaging(src, b);
  ASSERT_TRUE(p.ok()) << p.status();
  CheckInvariants(*p, b);
  EXPECT_EQ(BoxesOf(p->staging), (std::vector<std::vector<Box>>{{Box({0, 0}, {10, 10})}, {}, {}}));
  EXPECT_EQ(p->cut_blocks, 0);
  EXPECT_EQ(p->blocks, 9);
}

TEST(BlockStagingTest, CutBlocksGoToTheRankHoldingMostAndMerge) {
  // 300 rows on 4 ranks: 75 rows each; 128-row blocks are cut at rows 75, 150, 225.
  const BlockSize b{128, 128};
  const Layout src = Placed({4}, {300, 260}, {Placement::Shard(0)});
  absl::StatusOr<BlockStagingPlan> p = PlanBlockStaging(src, b);
  ASSERT_TRUE(p.ok()) << p.status();
  CheckInvariants(*p, b);
  EXPECT_EQ(p->blocks, 9);
  EXPECT_EQ(p->cut_blocks, 6);
  // Rows 0:128 - rank 0 holds 75 rows, rank 1 53; 128:256 - rank 1 22, rank 2 75, rank 3 31;
  // 256:300 - whole on rank 3: one box per block row, all columns merged.
  EXPECT_EQ(
      BoxesOf(p->staging),
      (std::vector<std::vector<Box>>{
          {Box({0, 0}, {128, 260})}, {}, {Box({128, 0}, {128, 260})}, {Box({256, 0}, {44, 260})}}));
  EXPECT_EQ(BoxesOf(p->scales),
            (std::vector<std::vector<Box>>{
                {Box({0, 0}, {1, 3})}, {}, {Box({1, 0}, {1, 3})}, {Box({2, 0}, {1, 3})}}));
}

TEST(BlockStagingTest, MixedWholeAndCutBlocks) {
  // 4x8 blocks, rows cut at 10 (rank 0: 0:10, rank 1: 10:20): block rows 0:4, 4:8 whole on
  // rank 0, 8:12 cut (rank 0 holds 2 rows, rank 1 2: the first wins), 12:16, 16:20 on rank 1.
  const BlockSize b{4, 8};
  const Layout src = Placed({2}, {20, 17}, {Placement::Shard(0)});
  absl::StatusOr<BlockStagingPlan> p = PlanBlockStaging(src, b);
  ASSERT_TRUE(p.ok()) << p.status();
  CheckInvariants(*p, b);
  EXPECT_EQ(p->blocks, 15);
  EXPECT_EQ(p->cut_blocks, 3);
  EXPECT_EQ(BoxesOf(p->staging),
            (std::vector<std::vector<Box>>{{Box({0, 0}, {12, 17})}, {Box({12, 0}, {8, 17})}}));
}

TEST(BlockStagingTest, ThreeDimsAndUnevenEdges) {
  const BlockSize b{4, 4};
  for (const Layout& src :
       {Placed({2, 2}, {3, 10, 7}, {Placement::Shard(0), Placement::Shard(2)}),
        Placed({3}, {2, 11, 13}, {Placement::Shard(1)}),
        Placed({2, 2}, {5, 9, 6}, {Placement::Shard(1), Placement::Replicate()})}) {
    absl::StatusOr<BlockStagingPlan> p = PlanBlockStaging(src, b);
    ASSERT_TRUE(p.ok()) << p.status();
    CheckInvariants(*p, b);
    EXPECT_EQ(p->staging.ranks().size(), src.ranks().size());
  }
  // Leading dims stay as the source cut them: S(0) over 3 x 8 x 8 holds whole blocks.
  const Layout lead = Placed({2}, {3, 8, 8}, {Placement::Shard(0)});
  absl::StatusOr<BlockStagingPlan> p = PlanBlockStaging(lead, b);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(BoxesOf(p->staging), BoxesOf(lead));
  EXPECT_EQ(p->cut_blocks, 0);
}

TEST(BlockStagingTest, ChunkLayoutsAndPartials) {
  // A flat layout cuts rows mid-way: blocks are made whole and the result still covers once.
  const BlockSize b{2, 3};
  absl::StatusOr<Layout> flat =
      Layout::FromFlat(Mesh({3}), {7, 5}, FlatSpec{{{0, 11}}, {{11, 23}}, {{23, 35}}});
  ASSERT_TRUE(flat.ok()) << flat.status();
  absl::StatusOr<BlockStagingPlan> p = PlanBlockStaging(*flat, b);
  ASSERT_TRUE(p.ok()) << p.status();
  CheckInvariants(*p, b);
  EXPECT_GT(p->cut_blocks, 0);
  // A partial source must be reduced: every block counts as cut.
  const Layout partial = Placed({2}, {4, 4}, {Placement::Partial()});
  p = PlanBlockStaging(partial, b);
  ASSERT_TRUE(p.ok()) << p.status();
  CheckInvariants(*p, b);
  EXPECT_EQ(p->cut_blocks, p->blocks);
}

// Each rank's staged chunks quantized on their own give, put together, what the whole tensor
// quantized at once gives (and likewise back).
TEST(BlockStagingTest, ChunksQuantizeAsTheWholeTensor) {
  const BlockSize b{4, 8};
  const Shape shape{2, 19, 21};
  const Layout src = Placed({3}, shape, {Placement::Shard(1)});
  absl::StatusOr<BlockStagingPlan> p = PlanBlockStaging(src, b);
  ASSERT_TRUE(p.ok()) << p.status();
  const int64_t n = src.num_elements();
  std::mt19937 rng(28);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[40] = -std::numeric_limits<float>::infinity();
  const Shape scale_shape = p->scales.global_shape();
  const int64_t nscales = Box::Whole(scale_shape).Volume();
  std::vector<uint8_t> want_q(static_cast<size_t>(n));
  std::vector<float> want_s(static_cast<size_t>(nscales));
  ASSERT_TRUE(QuantizeBlocks(x.data(), DType::kF32, shape, b, want_q.data(), want_s.data()).ok());
  std::vector<float> want_y(static_cast<size_t>(n));
  ASSERT_TRUE(
      DequantizeBlocks(want_q.data(), want_s.data(), shape, b, want_y.data(), DType::kF32).ok());

  auto flat_of = [](const Shape& shape, const Shape& idx) {
    int64_t flat = 0;
    for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
    return flat;
  };
  std::vector<uint8_t> got_q(static_cast<size_t>(n), 0xAA);
  std::vector<float> got_s(static_cast<size_t>(nscales), -1.0f);
  std::vector<float> got_y(static_cast<size_t>(n), -1.0f);
  for (size_t r = 0; r < p->staging.ranks().size(); ++r) {
    const RankChunks& rc = p->staging.ranks()[r];
    const RankChunks& sc = p->scales.ranks()[r];
    std::vector<float> local(static_cast<size_t>(rc.local_elements));
    for (const Chunk& c : rc.chunks) {
      int64_t i = c.local_offset;
      ForEachIndex(c.box, [&](const Shape& idx) { local[i++] = x[flat_of(shape, idx)]; });
    }
    std::vector<uint8_t> q(local.size());
    std::vector<float> s(static_cast<size_t>(sc.local_elements));
    ASSERT_TRUE(
        QuantizeChunks(local.data(), DType::kF32, shape, rc, b, sc, q.data(), s.data()).ok());
    std::vector<float> y(local.size());
    ASSERT_TRUE(DequantizeChunks(q.data(), s.data(), shape, rc, b, sc, y.data(), DType::kF32).ok());
    for (const Chunk& c : rc.chunks) {
      int64_t i = c.local_offset;
      ForEachIndex(c.box, [&](const Shape& idx) {
        got_q[flat_of(shape, idx)] = q[i];
        std::memcpy(&got_y[flat_of(shape, idx)], &y[i], sizeof(float));
        ++i;
      });
    }
    for (const Chunk& c : sc.chunks) {
      int64_t i = c.local_offset;
      ForEachIndex(c.box, [&](const Shape& idx) { got_s[flat_of(scale_shape, idx)] = s[i++]; });
    }
  }
  EXPECT_EQ(got_q, want_q);
  EXPECT_EQ(0, std::memcmp(got_s.data(), want_s.data(), want_s.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(got_y.data(), want_y.data(), want_y.size() * sizeof(float)));
}

TEST(BlockStagingTest, Refusals) {
  EXPECT_THAT(ErrorOf(PlanBlockStaging(Placed({2}, {8}, {Placement::Shard(0)}), BlockSize{})),
              HasSubstr("two dims"));
  EXPECT_FALSE(IsBlockAligned(Placed({2}, {10, 8}, {Placement::Shard(0)}), BlockSize{4, 4}));
  EXPECT_TRUE(IsBlockAligned(Placed({2}, {10, 8}, {Placement::Shard(1)}), BlockSize{4, 4}));
  // Chunks that cut blocks, or scale chunks that are not their blocks, are refused.
  const Layout cut = Placed({2}, {10, 8}, {Placement::Shard(0)});
  const RankChunks scales{0, {}, {Chunk{Box({0, 0}, {2, 2}), 0, 0}}, 4};
  std::vector<float> x(40), s(4);
  std::vector<uint8_t> q(40);
  absl::Status st = QuantizeChunks(x.data(), DType::kF32, {10, 8}, cut.ranks()[0], BlockSize{4, 4},
                                   scales, q.data(), s.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("chunks[0]: box [0:5, 0:8] is not aligned"));
  const Layout rows = Placed({2}, {8, 8}, {Placement::Shard(0)});
  st = QuantizeChunks(x.data(), DType::kF32, {8, 8}, rows.ranks()[1], BlockSize{4, 4}, scales,
                      q.data(), s.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("scale_chunks[0]: box [0:2, 0:2], want [1:2, 0:2]"));
}

}  // namespace
}  // namespace shardcoord
