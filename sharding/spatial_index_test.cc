#include "sharding/spatial_index.h"

#include <cstdint>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

// A deterministic pseudo-random stream (no std::random_device: runs must repeat).
class Lcg {
 public:
  int64_t Next(int64_t n) {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int64_t>((state_ >> 33) % static_cast<uint64_t>(n));
  }

 private:
  uint64_t state_ = 42;
};

// The boxes of a grid over `shape` cut into `parts` per dim, in lexicographic order.
std::vector<Box> Grid(const Shape& shape, const Shape& parts) {
  std::vector<Box> out{Box(Shape(shape.size(), 0), Shape(shape.size(), 0))};
  for (size_t d = 0; d < shape.size(); ++d) {
    std::vector<Box> next;
    for (const Box& b : out) {
      const int64_t step = shape[d] / parts[d];
      for (int64_t k = 0; k < parts[d]; ++k) {
        Shape off = b.offset(), shp = b.shape();
        off[d] = k * step;
        shp[d] = k + 1 == parts[d] ? shape[d] - k * step : step;
        next.emplace_back(off, shp);
      }
    }
    out = std::move(next);
  }
  return out;
}

std::vector<SourceBox> Entries(const std::vector<Box>& boxes) {
  std::vector<SourceBox> out;
  for (const Box& b : boxes) out.push_back({&b, 0, 0, 0});
  return out;
}

// Every query gets exactly the boxes a brute-force scan finds, for 1-d to 4-d grids (4-d
// picks its two discriminating dims).
TEST(BoxIndexTest, MatchesBruteForce) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{100}, {7}}, {{64, 48}, {4, 6}}, {{12, 10, 8}, {3, 1, 4}}, {{6, 8, 4, 10}, {1, 4, 2, 5}}};
  Lcg rng;
  for (const auto& [shape, parts] : cases) {
    const std::vector<Box> boxes = Grid(shape, parts);
    const std::vector<SourceBox> all = Entries(boxes);
    BoxIndex index;
    index.Build(all, 0, all.size(), static_cast<int>(shape.size()));
    for (int q = 0; q < 200; ++q) {
      Shape off(shape.size()), shp(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) {
        off[d] = rng.Next(shape[d]);
        shp[d] = 1 + rng.Next(shape[d] - off[d]);
      }
      const Box query(off, shp);
      std::set<size_t> want, got;
      for (size_t i = 0; i < boxes.size(); ++i) {
        if (boxes[i].Overlaps(query)) want.insert(i);
      }
      index.ForEachOverlap(query, [&](size_t i) { EXPECT_TRUE(got.insert(i).second); });
      EXPECT_EQ(got, want) << query.ToString();
    }
  }
}

TEST(BoxIndexTest, IndexesASubrange) {
  const std::vector<Box> boxes = Grid({10}, {5});
  const std::vector<SourceBox> all = Entries(boxes);
  BoxIndex index;
  index.Build(all, 2, 4, 1);  // [4, 6) and [6, 8).
  std::vector<size_t> got;
  index.ForEachOverlap(Box({0}, {10}), [&](size_t i) { got.push_back(i); });
  EXPECT_EQ(got, (std::vector<size_t>{2, 3}));
}

TEST(BoxIndexTest, ScalarsAlwaysOverlap) {
  const std::vector<Box> boxes = {Box({}, {}), Box({}, {})};
  const std::vector<SourceBox> all = Entries(boxes);
  BoxIndex index;
  index.Build(all, 0, 2, 0);
  int hits = 0;
  index.ForEachOverlap(Box({}, {}), [&](size_t) { ++hits; });
  EXPECT_EQ(hits, 2);
}

int64_t Volume(const std::vector<Box>& boxes) {
  int64_t v = 0;
  for (const Box& b : boxes) v += b.Volume();
  return v;
}

TEST(SubtractBoxTest, LeavesDisjointRest) {
  const Box x({0, 0}, {4, 4});
  EXPECT_EQ(SubtractBox(x, Box({8, 8}, {2, 2})), std::vector<Box>{x});
  EXPECT_TRUE(SubtractBox(x, Box({0, 0}, {4, 4})).empty());
  const Box a({1, 1}, {2, 2});
  const std::vector<Box> rest = SubtractBox(x, a);
  EXPECT_LE(rest.size(), 4u);
  EXPECT_EQ(Volume(rest), 16 - 4);
  for (size_t i = 0; i < rest.size(); ++i) {
    EXPECT_FALSE(rest[i].Overlaps(a));
    EXPECT_TRUE(x.Contains(rest[i]));
    for (size_t j = i + 1; j < rest.size(); ++j) EXPECT_FALSE(rest[i].Overlaps(rest[j]));
  }
}

std::optional<std::pair<size_t, size_t>> Find(const std::vector<Box>& boxes,
                                              const std::vector<int64_t>& owners) {
  std::vector<const Box*> ptrs;
  for (const Box& b : boxes) ptrs.push_back(&b);
  return FindOverlap(ptrs, owners);
}

TEST(FindOverlapTest, DisjointGridHasNone) {
  const std::vector<Box> boxes = Grid({8, 8}, {4, 2});
  std::vector<int64_t> owners(boxes.size());
  for (size_t i = 0; i < owners.size(); ++i) owners[i] = static_cast<int64_t>(i);
  EXPECT_EQ(Find(boxes, owners), std::nullopt);
}

TEST(FindOverlapTest, ReportsEarlierThenLater) {
  // Sweeps along dim 1 (most distinct offsets): [.., 4:8] is reached after [.., 0:6].
  const std::vector<Box> boxes = {Box({0, 4}, {2, 4}), Box({0, 0}, {2, 2}), Box({0, 2}, {2, 4})};
  const auto hit = Find(boxes, {0, 1, 2});
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(*hit, std::make_pair(size_t{2}, size_t{0}));
}

TEST(FindOverlapTest, OneOwnerMayOverlapItself) {
  const std::vector<Box> boxes = {Box({0}, {6}), Box({4}, {6}), Box({10}, {2})};
  EXPECT_EQ(Find(boxes, {7, 7, 8}), std::nullopt);
  EXPECT_TRUE(Find(boxes, {7, 8, 8}).has_value());
}

TEST(FindOverlapTest, Scalars) {
  const std::vector<Box> boxes = {Box({}, {}), Box({}, {})};
  EXPECT_EQ(Find(boxes, {1, 1}), std::nullopt);
  EXPECT_EQ(Find(boxes, {1, 2}), std::make_pair(size_t{0}, size_t{1}));
  EXPECT_EQ(Find({Box({}, {})}, {1}), std::nullopt);
}

}  // namespace
}  // namespace shardcoord
