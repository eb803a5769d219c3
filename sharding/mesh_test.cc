#include "sharding/mesh.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

using Groups = std::vector<std::vector<int64_t>>;

DeviceMesh MustCreate(Shape shape, std::vector<int64_t> ranks = {},
                      std::vector<std::string> names = {}) {
  absl::StatusOr<DeviceMesh> m =
      DeviceMesh::Create(std::move(shape), std::move(ranks), std::move(names));
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : DeviceMesh();
}

void ExpectInvalid(const absl::Status& s, const std::string& needle) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(needle));
}

TEST(DeviceMeshTest, DefaultRanksAreRowMajor) {
  DeviceMesh m = MustCreate({2, 4}, {}, {"dp", "tp"});
  EXPECT_EQ(m.ndim(), 2);
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.shape(), (Shape{2, 4}));
  EXPECT_EQ(m.shape(1), 4);
  EXPECT_THAT(m.ranks(), ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_THAT(m.dim_names(), ElementsAre("dp", "tp"));
  EXPECT_EQ(m.ShapeString(), "2x4");
  EXPECT_EQ(m.ToString(), "mesh 2x4 (dp, tp) ranks [0,1,2,3,4,5,6,7]");
  EXPECT_TRUE(m.Contains(7));
  EXPECT_FALSE(m.Contains(8));
  EXPECT_FALSE(m.Contains(-1));
}

TEST(DeviceMeshTest, ToStringAbbreviatesLongRankLists) {
  DeviceMesh m = MustCreate({4, 8});
  EXPECT_EQ(m.ToString(), "mesh 4x8 ranks [0,...,31]");
}

TEST(DeviceMeshTest, CreateRejectsBadShapes) {
  ExpectInvalid(DeviceMesh::Create({}).status(), "at least one dim");
  ExpectInvalid(DeviceMesh::Create({2, 0}).status(), "dim 1 must be positive");
  ExpectInvalid(DeviceMesh::Create({-3}).status(), "[-3]");
  // 2^32 positions: above the 2^31 limit, and the product itself must not overflow.
  ExpectInvalid(DeviceMesh::Create({1 << 16, 1 << 16}).status(), "2^31");
  ExpectInvalid(DeviceMesh::Create({int64_t{1} << 40, int64_t{1} << 40}).status(), "overflow");
}

TEST(DeviceMeshTest, CreateRejectsRanksThatDoNotMatchTheShape) {
  ExpectInvalid(DeviceMesh::Create({2, 2}, {0, 1, 2}).status(), "4 positions but 3 ranks");
  ExpectInvalid(DeviceMesh::Create({2}, {0, 1, 2}).status(), "2 positions but 3 ranks");
}

TEST(DeviceMeshTest, CreateRejectsDuplicateAndNegativeRanks) {
  ExpectInvalid(DeviceMesh::Create({2, 2}, {0, 1, 5, 1}).status(), "mesh rank 1 appears twice");
  ExpectInvalid(DeviceMesh::Create({3}, {0, -2, 1}).status(), "mesh rank -2 is negative");
}

TEST(DeviceMeshTest, CreateValidatesDimNames) {
  ExpectInvalid(DeviceMesh::Create({2, 2}, {}, {"dp"}).status(), "2 dims but 1 dim names");
  ExpectInvalid(DeviceMesh::Create({2, 2}, {}, {"dp", "dp"}).status(),
                "mesh dim name 'dp' appears twice");
  ExpectInvalid(DeviceMesh::Create({2, 2}, {}, {"dp", ""}).status(), "must not be empty");
  EXPECT_TRUE(DeviceMesh::Create({2, 2}, {}, {"dp", "tp"}).ok());
}

TEST(DeviceMeshTest, ArbitraryDistinctRanksAreAllowed) {
  DeviceMesh m = MustCreate({2, 2}, {10, 3, 7, 100});
  EXPECT_EQ(*m.RankAt({0, 0}), 10);
  EXPECT_EQ(*m.RankAt({0, 1}), 3);
  EXPECT_EQ(*m.RankAt({1, 0}), 7);
  EXPECT_EQ(*m.RankAt({1, 1}), 100);
  EXPECT_EQ(*m.CoordOf(100), (Shape{1, 1}));
  EXPECT_FALSE(m.Contains(0));
}

TEST(DeviceMeshTest, RankAtRejectsBadCoordinates) {
  DeviceMesh m = MustCreate({2, 4});
  EXPECT_EQ(m.RankAt({1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.RankAt({0, 4}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m.RankAt({-1, 0}).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(std::string(m.RankAt({2, 0}).status().message()), HasSubstr("[2, 0]"));
  EXPECT_EQ(m.CoordOf(8).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(m.CoordOf(8).status().message()), HasSubstr("rank 8"));
}

// RankAt and CoordOf are inverse for every position, for every permutation of ranks of a
// few shapes (all permutations of 6 ranks; random ones of larger meshes).
TEST(DeviceMeshTest, RankAtCoordOfRoundTripUnderPermutations) {
  for (const Shape& shape : {Shape{6}, Shape{2, 3}, Shape{3, 2}, Shape{1, 6}, Shape{3, 1, 2}}) {
    std::vector<int64_t> perm(6);
    std::iota(perm.begin(), perm.end(), 0);
    int count = 0;
    do {
      DeviceMesh m = MustCreate(shape, perm);
      for (int64_t i = 0; i < m.size(); ++i) {
        const Shape c = m.CoordAtIndex(i);
        ASSERT_EQ(*m.RankAt(c), perm[i]);
        ASSERT_EQ(*m.CoordOf(perm[i]), c);
      }
      ++count;
    } while (std::next_permutation(perm.begin(), perm.end()));
    EXPECT_EQ(count, 720);
  }
  std::mt19937_64 rng(20240611);
  for (int iter = 0; iter < 50; ++iter) {
    const Shape shape = {2, 3, 4, 5};
    std::vector<int64_t> ranks(120);
    for (int i = 0; i < 120; ++i) ranks[i] = 1000 + 3 * i;  // Sparse, distinct.
    std::shuffle(ranks.begin(), ranks.end(), rng);
    DeviceMesh m = MustCreate(shape, ranks);
    std::set<Shape> seen;
    for (int64_t r : ranks) {
      absl::StatusOr<Shape> c = m.CoordOf(r);
      ASSERT_TRUE(c.ok());
      ASSERT_TRUE(seen.insert(*c).second);
      ASSERT_EQ(*m.RankAt(*c), r);
    }
  }
}

TEST(DeviceMeshTest, CoordAtIndexIsRowMajor) {
  DeviceMesh m = MustCreate({2, 3, 4});
  EXPECT_EQ(m.CoordAtIndex(0), (Shape{0, 0, 0}));
  EXPECT_EQ(m.CoordAtIndex(1), (Shape{0, 0, 1}));
  EXPECT_EQ(m.CoordAtIndex(4), (Shape{0, 1, 0}));
  EXPECT_EQ(m.CoordAtIndex(12), (Shape{1, 0, 0}));
  EXPECT_EQ(m.CoordAtIndex(23), (Shape{1, 2, 3}));
}

TEST(DeviceMeshTest, DimIndexByNameAndNumber) {
  DeviceMesh m = MustCreate({2, 2, 2}, {}, {"pp", "dp", "tp"});
  EXPECT_EQ(*m.DimIndex("pp"), 0);
  EXPECT_EQ(*m.DimIndex("dp"), 1);
  EXPECT_EQ(*m.DimIndex("tp"), 2);
  EXPECT_EQ(*m.DimIndex("0"), 0);
  EXPECT_EQ(*m.DimIndex("2"), 2);
  ExpectInvalid(m.DimIndex("3").status(), "mesh dim '3'");
  ExpectInvalid(m.DimIndex("-1").status(), "mesh dim '-1'");
  ExpectInvalid(m.DimIndex("ep").status(), "mesh dim 'ep'");
  ExpectInvalid(m.DimIndex("").status(), "mesh dim ''");

  DeviceMesh unnamed = MustCreate({4});
  EXPECT_EQ(*unnamed.DimIndex("0"), 0);
  ExpectInvalid(unnamed.DimIndex("dp").status(), "mesh dim 'dp'");
}

TEST(DeviceMeshTest, SubGroupsOfTwoByFour) {
  DeviceMesh m = MustCreate({2, 4}, {}, {"dp", "tp"});
  EXPECT_EQ(*m.SubGroups({1}), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(*m.SubGroups({0}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(*m.SubGroups({0, 1}), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  // Order of the requested dims does not matter: positions are row-major over sorted dims.
  EXPECT_EQ(*m.SubGroups({1, 0}), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  // No dims: every rank is its own group.
  EXPECT_EQ(*m.SubGroups({}), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

TEST(DeviceMeshTest, SubGroupsRejectBadDims) {
  DeviceMesh m = MustCreate({2, 4});
  ExpectInvalid(m.SubGroups({2}).status(), "mesh dim 2 is out of range");
  ExpectInvalid(m.SubGroups({-1}).status(), "mesh dim -1 is out of range");
  ExpectInvalid(m.SubGroups({1, 1}).status(), "mesh dim 1 repeated");
  ExpectInvalid(m.GroupOf(0, {5}).status(), "mesh dim 5");
}

TEST(DeviceMeshTest, SubGroupsOfThreeDimMesh) {
  // pp=2 x dp=2 x tp=3 over 0..11: rank = 6*pp + 3*dp + tp.
  DeviceMesh m = MustCreate({2, 2, 3});
  EXPECT_EQ(*m.SubGroups({2}), (Groups{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 10, 11}}));
  EXPECT_EQ(*m.SubGroups({1}), (Groups{{0, 3}, {1, 4}, {2, 5}, {6, 9}, {7, 10}, {8, 11}}));
  EXPECT_EQ(*m.SubGroups({0}), (Groups{{0, 6}, {1, 7}, {2, 8}, {3, 9}, {4, 10}, {5, 11}}));
  EXPECT_EQ(*m.SubGroups({0, 2}), (Groups{{0, 1, 2, 6, 7, 8}, {3, 4, 5, 9, 10, 11}}));
  EXPECT_EQ(*m.SubGroups({1, 2}), (Groups{{0, 1, 2, 3, 4, 5}, {6, 7, 8, 9, 10, 11}}));
  EXPECT_EQ(*m.SubGroups({0, 1}), (Groups{{0, 3, 6, 9}, {1, 4, 7, 10}, {2, 5, 8, 11}}));
  EXPECT_EQ(m.SubGroups({0, 1, 2})->size(), 1u);
}

TEST(DeviceMeshTest, SubGroupsFollowPermutedRanks) {
  // Position (i, j) holds ranks[4*i + j]; groups list ranks, not positions.
  DeviceMesh m = MustCreate({2, 4}, {7, 6, 5, 4, 3, 2, 1, 0});
  EXPECT_EQ(*m.SubGroups({1}), (Groups{{7, 6, 5, 4}, {3, 2, 1, 0}}));
  EXPECT_EQ(*m.SubGroups({0}), (Groups{{7, 3}, {6, 2}, {5, 1}, {4, 0}}));
  EXPECT_EQ(*m.GroupOf(2, {0}), (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(*m.GroupOf(2, {1}), (std::vector<int64_t>{3, 2, 1, 0}));

  DeviceMesh m3 = MustCreate({2, 1, 2}, {11, 20, 5, 9});
  EXPECT_EQ(*m3.SubGroups({2}), (Groups{{11, 20}, {5, 9}}));
  EXPECT_EQ(*m3.SubGroups({0}), (Groups{{11, 5}, {20, 9}}));
  EXPECT_EQ(*m3.SubGroups({1}), (Groups{{11}, {20}, {5}, {9}}));
}

// For random meshes and dim sets: groups partition the ranks, have the product of the
// group dims' sizes as size, and members agree on every coordinate outside the group dims.
TEST(DeviceMeshTest, SubGroupsPartitionRandomMeshes) {
  std::mt19937_64 rng(77);
  for (int iter = 0; iter < 300; ++iter) {
    const int ndim = 1 + static_cast<int>(rng() % 3);
    Shape shape(ndim);
    for (int64_t& s : shape) s = 1 + static_cast<int64_t>(rng() % 4);
    int64_t size = 1;
    for (int64_t s : shape) size *= s;
    std::vector<int64_t> ranks(size);
    std::iota(ranks.begin(), ranks.end(), 0);
    std::shuffle(ranks.begin(), ranks.end(), rng);
    DeviceMesh m = MustCreate(shape, ranks);
    std::vector<int> dims;
    for (int d = 0; d < ndim; ++d) {
      if (rng() % 2) dims.push_back(d);
    }
    absl::StatusOr<Groups> groups = m.SubGroups(dims);
    ASSERT_TRUE(groups.ok()) << groups.status();
    int64_t group_size = 1;
    for (int d : dims) group_size *= shape[d];
    ASSERT_EQ(static_cast<int64_t>(groups->size()), size / group_size);
    std::set<int64_t> all;
    for (const std::vector<int64_t>& g : *groups) {
      ASSERT_EQ(static_cast<int64_t>(g.size()), group_size);
      const Shape c0 = *m.CoordOf(g[0]);
      Shape prev;
      for (int64_t r : g) {
        ASSERT_TRUE(all.insert(r).second) << "rank " << r << " in two groups";
        const Shape c = *m.CoordOf(r);
        Shape inner;
        for (int d = 0; d < ndim; ++d) {
          if (std::find(dims.begin(), dims.end(), d) == dims.end()) {
            ASSERT_EQ(c[d], c0[d]);
          } else {
            inner.push_back(c[d]);
          }
        }
        if (!prev.empty()) ASSERT_LT(prev, inner);  // Ordered by the group coordinates.
        prev = inner;
        ASSERT_EQ(*m.GroupOf(r, dims), g);
      }
    }
    ASSERT_EQ(static_cast<int64_t>(all.size()), size);
  }
}

TEST(DeviceMeshTest, GroupOf) {
  DeviceMesh m = MustCreate({2, 4}, {}, {"dp", "tp"});
  EXPECT_EQ(*m.GroupOf(5, {1}), (std::vector<int64_t>{4, 5, 6, 7}));
  EXPECT_EQ(*m.GroupOf(5, {0}), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(*m.GroupOf(5, {0, 1}), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(*m.GroupOf(5, {}), (std::vector<int64_t>{5}));
  EXPECT_EQ(m.GroupOf(8, {1}).status().code(), absl::StatusCode::kNotFound);
}

TEST(DeviceMeshTest, Equality) {
  EXPECT_TRUE(MustCreate({2, 2}) == MustCreate({2, 2}, {0, 1, 2, 3}));
  EXPECT_FALSE(MustCreate({2, 2}) == MustCreate({4}));
  EXPECT_FALSE(MustCreate({2, 2}) == MustCreate({2, 2}, {1, 0, 2, 3}));
  EXPECT_FALSE(MustCreate({2, 2}) == MustCreate({2, 2}, {}, {"a", "b"}));
}

}  // namespace
}  // namespace shardcoord
