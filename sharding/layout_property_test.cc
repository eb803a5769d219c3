// Randomized property tests (fixed seeds) for Layout construction and ValidateLayout,
// checked against a brute-force oracle that looks at every element.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "sharding/box.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

using Rng = std::mt19937_64;

int64_t Uniform(Rng& rng, int64_t lo, int64_t hi) {  // Inclusive.
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

DeviceMesh RandomMesh(Rng& rng) {
  Shape shape(Uniform(rng, 1, 3));
  for (int64_t& s : shape) s = Uniform(rng, 1, 5);
  int64_t size = 1;
  for (int64_t s : shape) size *= s;
  // Distinct, not necessarily contiguous, in random order.
  std::vector<int64_t> ranks(size);
  const int64_t stride = Uniform(rng, 1, 3), base = Uniform(rng, 0, 10);
  for (int64_t i = 0; i < size; ++i) ranks[i] = base + stride * i;
  std::shuffle(ranks.begin(), ranks.end(), rng);
  absl::StatusOr<DeviceMesh> m = DeviceMesh::Create(shape, ranks);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

Shape RandomShape(Rng& rng) {
  Shape shape(Uniform(rng, 1, 3));
  for (int64_t& s : shape) s = Uniform(rng, 0, 9);
  return shape;
}

// `k` non-negative sizes summing to `n` (zeros included).
std::vector<int64_t> RandomSizes(Rng& rng, int64_t n, int64_t k) {
  std::vector<int64_t> cuts = {0, n};
  for (int64_t i = 0; i + 1 < k; ++i) cuts.push_back(Uniform(rng, 0, n));
  std::sort(cuts.begin(), cuts.end());
  std::vector<int64_t> sizes;
  for (size_t i = 1; i < cuts.size(); ++i) sizes.push_back(cuts[i] - cuts[i - 1]);
  return sizes;
}

// One placement per mesh dim. Explicit sizes only on a tensor dim no earlier mesh dim has
// split: later splits see rank-dependent extents that one size list cannot fit.
std::vector<Placement> RandomPlacements(Rng& rng, const DeviceMesh& mesh, const Shape& shape) {
  const int ndim = static_cast<int>(shape.size());
  std::vector<bool> split(ndim, false);
  std::vector<Placement> out;
  for (int i = 0; i < mesh.ndim(); ++i) {
    const int64_t kind = Uniform(rng, 0, 5);
    const int d = static_cast<int>(Uniform(rng, -ndim, ndim - 1));
    const int nd = d < 0 ? d + ndim : d;
    if (kind <= 1) {
      out.push_back(Placement::Shard(d));
      split[nd] = true;
    } else if (kind == 2 && !split[nd]) {
      out.push_back(Placement::Shard(d, RandomSizes(rng, shape[nd], mesh.shape(i))));
      split[nd] = true;
    } else if (kind <= 3) {
      out.push_back(Placement::Replicate());
    } else {
      out.push_back(Placement::Partial(ReduceOp::kSum));
    }
  }
  return out;
}

// A random partition of [0, numel) into ranges (plus a few empty ones), dealt to a random
// subset of the ranks and shuffled within each rank.
FlatSpec RandomFlatSpec(Rng& rng, int64_t num_ranks, int64_t numel) {
  std::vector<int64_t> cuts = {0, numel};
  const int64_t num_cuts = Uniform(rng, 0, std::min<int64_t>(numel, 2 * num_ranks + 2));
  for (int64_t i = 0; i < num_cuts; ++i) cuts.push_back(Uniform(rng, 0, numel));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  std::vector<FlatRange> ranges;
  for (size_t i = 1; i < cuts.size(); ++i) ranges.push_back({cuts[i - 1], cuts[i]});
  for (int64_t i = Uniform(rng, 0, 2); i > 0; --i) {
    const int64_t at = Uniform(rng, 0, numel);
    ranges.push_back({at, at});
  }
  std::vector<int64_t> active(num_ranks);
  std::iota(active.begin(), active.end(), 0);
  std::shuffle(active.begin(), active.end(), rng);
  active.resize(Uniform(rng, 1, num_ranks));
  FlatSpec spec(num_ranks);
  for (const FlatRange& r : ranges) spec[active[Uniform(rng, 0, active.size() - 1)]].push_back(r);
  for (std::vector<FlatRange>& rs : spec) std::shuffle(rs.begin(), rs.end(), rng);
  return spec;
}

// Calls f(flat index) for every element of an in-bounds box.
template <typename F>
void ForEachElement(const Shape& shape, const Box& box, F f) {
  if (box.Empty()) return;
  const Shape strides = RowMajorStrides(shape);
  Shape idx(box.ndim(), 0);
  while (true) {
    int64_t flat = 0;
    for (int d = 0; d < box.ndim(); ++d) flat += (box.offset(d) + idx[d]) * strides[d];
    f(flat);
    int d = box.ndim() - 1;
    while (d >= 0 && ++idx[d] == box.shape(d)) idx[d--] = 0;
    if (d < 0) return;
  }
}

// Brute-force statement of what ValidateLayout promises, element by element. Returns "" if
// valid, else why not. Values in these tests are small, so plain arithmetic is safe here.
std::string Oracle(const Shape& shape, const std::vector<RankChunks>& ranks, int64_t num_partials) {
  const int ndim = static_cast<int>(shape.size());
  const int64_t numel = Box::Whole(shape).Volume();
  std::set<int64_t> seen_ranks;
  std::vector<std::set<Box>> distinct(num_partials);
  for (const RankChunks& rc : ranks) {
    if (rc.rank < 0 || !seen_ranks.insert(rc.rank).second) return "bad or repeated rank";
    if (rc.local_elements < 0) return "negative local buffer";
    std::vector<int64_t> local_use(rc.local_elements, 0);
    std::set<std::pair<int64_t, Box>> held;
    for (const Chunk& c : rc.chunks) {
      if (c.box.ndim() != ndim) return "wrong ndim";
      for (int d = 0; d < ndim; ++d) {
        if (c.box.offset(d) < 0 || c.box.shape(d) < 0 || c.box.end(d) > shape[d]) {
          return absl::StrCat("out of bounds ", c.box.ToString());
        }
      }
      if (c.partial_index < 0 || c.partial_index >= num_partials) return "bad partial index";
      const int64_t v = c.box.Volume();
      if (c.local_offset < 0 || c.local_offset + v > rc.local_elements) return "local fit";
      if (v == 0) continue;
      for (int64_t i = c.local_offset; i < c.local_offset + v; ++i) {
        if (local_use[i]++) return "local overlap";
      }
      if (!held.insert({c.partial_index, c.box}).second) return "same box twice on a rank";
      distinct[c.partial_index].insert(c.box);
    }
  }
  for (int64_t p = 0; p < num_partials; ++p) {
    std::vector<int> count(numel, 0);
    for (const Box& b : distinct[p]) ForEachElement(shape, b, [&](int64_t f) { ++count[f]; });
    for (int64_t f = 0; f < numel; ++f) {
      if (count[f] != 1) {
        return absl::StrCat("element ", f, " of partial ", p, " covered by ", count[f],
                            " distinct boxes");
      }
    }
  }
  return "";
}

std::string Describe(const Shape& shape, const std::vector<RankChunks>& ranks) {
  std::string s = absl::StrCat("tensor ", ShapeToString(shape), ":");
  for (const RankChunks& rc : ranks) {
    absl::StrAppend(&s, " r", rc.rank, "(", rc.local_elements, ")");
    for (const Chunk& c : rc.chunks) {
      absl::StrAppend(&s, " ", c.box.ToString(), "@", c.local_offset, "p", c.partial_index);
    }
  }
  return s;
}

TEST(LayoutPropertyTest, PlacementLayoutsCoverEachElementOncePerReplica) {
  Rng rng(0x5eed0001);
  int checked = 0, with_partial = 0, with_sizes = 0, with_replicate = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const DeviceMesh mesh = RandomMesh(rng);
    const Shape shape = RandomShape(rng);
    const std::vector<Placement> placements = RandomPlacements(rng, mesh, shape);
    absl::StatusOr<Layout> l = Layout::FromPlacements(mesh, shape, placements);
    const std::string what =
        absl::StrCat("iter ", iter, ": ", PlacementsToString(placements), " on ", mesh.ToString(),
                     " tensor ", ShapeToString(shape));
    ASSERT_TRUE(l.ok()) << what << ": " << l.status();
    ASSERT_TRUE(ValidateLayout(shape, l->ranks(), l->num_partials()).ok()) << what;
    ASSERT_EQ(Oracle(shape, l->ranks(), l->num_partials()), "") << what;

    // Every element is held by exactly (product of Replicate mesh dims) ranks per partial.
    int64_t replicas = 1, partials = 1;
    for (int i = 0; i < mesh.ndim(); ++i) {
      if (placements[i].is_replicate()) replicas *= mesh.shape(i);
      if (placements[i].is_partial()) partials *= mesh.shape(i);
      if (!placements[i].sizes.empty()) ++with_sizes;
    }
    ASSERT_EQ(l->num_partials(), partials) << what;
    const int64_t numel = l->num_elements();
    std::vector<int64_t> holders(partials * numel, 0);
    ASSERT_EQ(static_cast<int64_t>(l->ranks().size()), mesh.size()) << what;
    for (const RankChunks& rc : l->ranks()) {
      ASSERT_EQ(rc.chunks.size(), 1u) << what;
      const Chunk& c = rc.chunks[0];
      ASSERT_EQ(c.local_offset, 0) << what;
      ASSERT_EQ(rc.local_elements, c.box.Volume()) << what;
      ASSERT_EQ(*mesh.RankAt(rc.coord), rc.rank) << what;
      ForEachElement(shape, c.box, [&](int64_t f) { ++holders[c.partial_index * numel + f]; });
    }
    for (size_t i = 0; i < holders.size(); ++i) {
      ASSERT_EQ(holders[i], replicas)
          << what << ": element " << i % numel << " of partial " << i / numel;
    }
    ++checked;
    with_partial += partials > 1;
    with_replicate += replicas > 1;
  }
  EXPECT_EQ(checked, 4000);
  // The generator really exercises every kind of placement.
  EXPECT_GT(with_partial, 500);
  EXPECT_GT(with_replicate, 500);
  EXPECT_GT(with_sizes, 500);
}

TEST(LayoutPropertyTest, FlatLayoutsCoverEachElementOnce) {
  Rng rng(0x5eed0002);
  int some_rank_empty = 0;
  for (int iter = 0; iter < 4000; ++iter) {
    const DeviceMesh mesh = RandomMesh(rng);
    const Shape shape = RandomShape(rng);
    const int64_t numel = Box::Whole(shape).Volume();
    const FlatSpec spec = RandomFlatSpec(rng, mesh.size(), numel);
    const std::string what = absl::StrCat("iter ", iter, ": flat ", FlatSpecToString(spec), " on ",
                                          mesh.ToString(), " tensor ", ShapeToString(shape));
    absl::StatusOr<Layout> l = Layout::FromFlat(mesh, shape, spec);
    ASSERT_TRUE(l.ok()) << what << ": " << l.status();
    ASSERT_TRUE(ValidateLayout(shape, l->ranks(), 1).ok()) << what;
    ASSERT_EQ(Oracle(shape, l->ranks(), 1), "") << what;
    // Each rank's buffer is its ranges concatenated, each range in at most 2*ndim-1 boxes,
    // and the boxes' elements in local order are exactly the ranges' flat indices.
    for (int64_t i = 0; i < mesh.size(); ++i) {
      const RankChunks& rc = l->ranks()[i];
      ASSERT_EQ(rc.rank, mesh.ranks()[i]) << what;
      std::vector<int64_t> want, got;
      for (const FlatRange& r : spec[i]) {
        for (int64_t f = r.start; f < r.end; ++f) want.push_back(f);
      }
      int64_t next_local = 0;
      for (const Chunk& c : rc.chunks) {
        ASSERT_EQ(c.local_offset, next_local) << what;
        next_local += c.box.Volume();
        ForEachElement(shape, c.box, [&](int64_t f) { got.push_back(f); });
      }
      ASSERT_EQ(rc.local_elements, static_cast<int64_t>(want.size())) << what;
      ASSERT_EQ(got, want) << what;
      ASSERT_LE(rc.chunks.size(), spec[i].size() * (2 * shape.size() - 1)) << what;
      some_rank_empty += spec[i].empty();
    }
  }
  EXPECT_GT(some_rank_empty, 1000);
}

// A random valid layout of either kind, as raw chunk metadata.
struct Sample {
  Shape shape;
  std::vector<RankChunks> ranks;
  int64_t num_partials = 1;
};

Sample RandomValidLayout(Rng& rng) {
  while (true) {
    const DeviceMesh mesh = RandomMesh(rng);
    const Shape shape = RandomShape(rng);
    absl::StatusOr<Layout> l;
    if (Uniform(rng, 0, 1)) {
      l = Layout::FromPlacements(mesh, shape, RandomPlacements(rng, mesh, shape));
    } else {
      l = Layout::FromFlat(mesh, shape,
                           RandomFlatSpec(rng, mesh.size(), Box::Whole(shape).Volume()));
    }
    EXPECT_TRUE(l.ok()) << l.status();
    if (!l.ok() || l->num_elements() == 0) continue;  // Corruptions need elements.
    return Sample{shape, l->ranks(), l->num_partials()};
  }
}

enum Corruption {
  kShrink,
  kGrowPastBounds,
  kShift,
  kDrop,
  kDuplicateElsewhere,
  kLocalOverlap,
  kPartialIndex,
  kNumCorruptions
};
const char* const kCorruptionNames[] = {"shrink",       "grow past bounds",    "shift",
                                        "drop",         "duplicate elsewhere", "local overlap",
                                        "partial index"};

// Applies corruption `kind` to one random non-empty chunk. False if it does not apply.
bool Corrupt(Rng& rng, Corruption kind, Sample& s) {
  std::vector<std::pair<size_t, size_t>> nonempty;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    for (size_t c = 0; c < s.ranks[r].chunks.size(); ++c) {
      if (!s.ranks[r].chunks[c].box.Empty()) nonempty.push_back({r, c});
    }
  }
  if (nonempty.empty()) return false;
  const auto [ri, ci] = nonempty[Uniform(rng, 0, nonempty.size() - 1)];
  RankChunks& rc = s.ranks[ri];
  Chunk& c = rc.chunks[ci];
  const int ndim = c.box.ndim();
  if (ndim == 0) return false;
  Shape off = c.box.offset(), shp = c.box.shape();
  const int d = static_cast<int>(Uniform(rng, 0, ndim - 1));
  switch (kind) {
    case kShrink: {  // From either end; may leave the box empty.
      const int64_t by = Uniform(rng, 1, shp[d]);
      if (Uniform(rng, 0, 1)) off[d] += by;
      shp[d] -= by;
      c.box = Box(off, shp);
      return true;
    }
    case kGrowPastBounds: {
      shp[d] = s.shape[d] - off[d] + Uniform(rng, 1, 3);
      c.box = Box(off, shp);
      // Make the buffer big enough that only the bounds are wrong.
      rc.local_elements = std::max(rc.local_elements, c.local_offset + c.box.Volume());
      return true;
    }
    case kShift: {  // Stays in bounds.
      const int64_t lo = -off[d], hi = s.shape[d] - off[d] - shp[d];
      if (lo == 0 && hi == 0) return false;
      int64_t by = 0;
      while (by == 0) by = Uniform(rng, lo, hi);
      off[d] += by;
      c.box = Box(off, shp);
      return true;
    }
    case kDrop:
      rc.chunks.erase(rc.chunks.begin() + ci);
      return true;
    case kDuplicateElsewhere: {  // A copy at another in-bounds position on a random rank.
      Shape pos(ndim);
      for (int e = 0; e < ndim; ++e) pos[e] = Uniform(rng, 0, s.shape[e] - shp[e]);
      if (pos == off) return false;
      Chunk copy{Box(pos, shp), 0, c.partial_index};
      RankChunks& to = s.ranks[Uniform(rng, 0, s.ranks.size() - 1)];
      copy.local_offset = to.local_elements;
      to.local_elements += copy.box.Volume();
      to.chunks.push_back(std::move(copy));
      return true;
    }
    case kLocalOverlap: {
      // Onto another chunk's local range, or (if the rank has just one) past the buffer end.
      std::vector<size_t> others;
      for (size_t o = 0; o < rc.chunks.size(); ++o) {
        if (o != ci && !rc.chunks[o].box.Empty()) others.push_back(o);
      }
      if (others.empty()) {
        c.local_offset = rc.local_elements - c.box.Volume() + Uniform(rng, 1, 3);
      } else {
        const Chunk& o = rc.chunks[others[Uniform(rng, 0, others.size() - 1)]];
        c.local_offset = o.local_offset + Uniform(rng, 0, o.box.Volume() - 1);
      }
      return true;
    }
    case kPartialIndex: {
      int64_t p = c.partial_index;
      while (p == c.partial_index) p = Uniform(rng, -1, s.num_partials);
      c.partial_index = p;
      return true;
    }
    case kNumCorruptions:
      break;
  }
  return false;
}

TEST(LayoutPropertyTest, ValidationRejectsEveryCorruptionThatChangesCoverage) {
  Rng rng(0x5eed0003);
  int rejected[kNumCorruptions] = {}, harmless[kNumCorruptions] = {};
  for (int iter = 0; iter < 14000; ++iter) {
    Sample s = RandomValidLayout(rng);
    const Corruption kind = static_cast<Corruption>(iter % kNumCorruptions);
    const std::string before = Describe(s.shape, s.ranks);
    if (!Corrupt(rng, kind, s)) continue;
    const std::string why = Oracle(s.shape, s.ranks, s.num_partials);
    const absl::Status status = ValidateLayout(s.shape, s.ranks, s.num_partials);
    const std::string what =
        absl::StrCat("iter ", iter, " ", kCorruptionNames[kind], "\nbefore: ", before,
                     "\nafter:  ", Describe(s.shape, s.ranks));
    if (why.empty()) {
      // E.g. a dropped or shrunk-to-empty replica, or a duplicate that is a replica: the
      // layout is still valid and must still be accepted.
      ASSERT_TRUE(status.ok()) << what << "\n" << status;
      ++harmless[kind];
    } else {
      ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument)
          << what << "\noracle: " << why << "\n"
          << status;
      ++rejected[kind];
    }
  }
  for (int k = 0; k < kNumCorruptions; ++k) {
    // Each kind of corruption really broke many layouts.
    EXPECT_GT(rejected[k], 800) << kCorruptionNames[k] << " (harmless " << harmless[k] << ")";
  }
  // Harmless ones exist too (replicas), so the oracle, not the generator, decides.
  EXPECT_GT(harmless[kDrop], 50);
}

}  // namespace
}  // namespace shardcoord
