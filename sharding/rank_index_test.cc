#include "sharding/rank_index.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

Layout Replicated(std::vector<int64_t> ranks) {
  const int64_t n = static_cast<int64_t>(ranks.size());
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({n}, std::move(ranks));
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<Layout> l = Layout::FromPlacements(*mesh, {4}, {Placement::Replicate()});
  EXPECT_TRUE(l.ok()) << l.status();
  return *std::move(l);
}

void ExpectDenseAscending(const RankIndex& index, const std::vector<int64_t>& want) {
  ASSERT_EQ(index.size(), static_cast<int>(want.size()));
  for (int id = 0; id < index.size(); ++id) {
    EXPECT_EQ(index.Rank(id), want[id]);
    EXPECT_EQ(index.Id(want[id]), id);
  }
}

TEST(RankIndexTest, UnionOfBothLayoutsInRankOrder) {
  ExpectDenseAscending(RankIndex(Replicated({5, 1, 3}), Replicated({3, 0, 7})), {0, 1, 3, 5, 7});
}

// Rank numbers far beyond the count take the hashed path; ids are the same kind.
TEST(RankIndexTest, SparseRanks) {
  ExpectDenseAscending(RankIndex(Replicated({1000000, 2}), Replicated({2, 500000})),
                       {2, 500000, 1000000});
}

}  // namespace
}  // namespace shardcoord
