#include "sharding/layout.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/spatial_index.h"

namespace shardcoord {
namespace {

struct RankedBox {
  Box box;
  int64_t rank;
};

// Box::InBounds and Box::ToString compute offset + shape, which can overflow int64 for
// unchecked chunk metadata (e.g. reported by a worker); these never do.
bool InBoundsNoOverflow(const Box& b, absl::Span<const int64_t> shape) {
  if (static_cast<size_t>(b.ndim()) != shape.size()) return false;
  for (int d = 0; d < b.ndim(); ++d) {
    // shape[d] >= 0 and 0 <= offset <= shape[d], so shape[d] - offset cannot overflow.
    if (b.offset(d) < 0 || b.shape(d) < 0 || b.offset(d) > shape[d] ||
        b.shape(d) > shape[d] - b.offset(d)) {
      return false;
    }
  }
  return true;
}

std::string UncheckedBoxString(const Box& b) {
  std::string s = "[";
  for (int d = 0; d < b.ndim(); ++d) {
    if (d) s += ", ";
    int64_t end;
    if (__builtin_add_overflow(b.offset(d), b.shape(d), &end)) {
      absl::StrAppend(&s, b.offset(d), ":", b.offset(d), "+", b.shape(d));
    } else {
      absl::StrAppend(&s, b.offset(d), ":", end);
    }
  }
  return s + "]";
}

// Finds a pair of overlapping boxes among `boxes` (no two identical).
absl::Status CheckNoOverlap(const std::vector<RankedBox>& boxes, int ndim) {
  if (boxes.size() < 2 || ndim == 0) {
    if (boxes.size() >= 2) {  // Two distinct non-empty 0-d boxes cannot exist.
      return absl::InvalidArgumentError("scalar tensor held as two different chunks");
    }
    return absl::OkStatus();
  }
  // Each box its own owner: chunks of one rank must not overlap either.
  std::vector<const Box*> ptrs;
  std::vector<int64_t> owners;
  ptrs.reserve(boxes.size());
  owners.reserve(boxes.size());
  for (size_t i = 0; i < boxes.size(); ++i) {
    ptrs.push_back(&boxes[i].box);
    owners.push_back(static_cast<int64_t>(i));
  }
  if (std::optional<std::pair<size_t, size_t>> hit = FindOverlap(ptrs, owners)) {
    const RankedBox& a = boxes[hit->first];
    const RankedBox& b = boxes[hit->second];
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", b.rank, " chunk ", b.box.ToString(), " overlaps rank ", a.rank,
                     " chunk ", a.box.ToString(), " and they are not identical replicas"));
  }
  return absl::OkStatus();
}

}  // namespace

std::pair<int64_t, int64_t> ChunkPiece(int64_t n, int64_t k, int64_t j) {
  if (n == 0) return {0, 0};
  const int64_t cs = n / k + (n % k != 0);
  const int64_t start = std::min(j * cs, n);
  return {start, std::min(cs, n - start)};
}

std::vector<Box> FlatRangeToBoxes(const Shape& shape, int64_t start, int64_t end) {
  std::vector<Box> out;
  const int ndim = static_cast<int>(shape.size());
  if (start >= end) return out;
  // Outside the tensor there is nothing to split (and a zero dim would divide by zero);
  // FromFlat rejects such ranges before calling this.
  absl::StatusOr<int64_t> numel = CheckedProduct(shape);
  if (start < 0 || !numel.ok() || end > *numel) return out;
  if (ndim == 0) {
    out.emplace_back(Shape{}, Shape{});
    return out;
  }
  const Shape strides = RowMajorStrides(shape);
  // Recursive over dims: [a, b) lies inside the sub-tensor at `prefix` (fixed leading coords).
  auto emit = [&](auto&& self, int d, Shape prefix, int64_t a, int64_t b) -> void {
    if (a >= b) return;
    auto box_at = [&](int64_t lo, int64_t hi) {  // Rows [lo, hi) of dim d, full below.
      Shape off = prefix, shp(prefix.size(), 1);
      off.push_back(lo);
      shp.push_back(hi - lo);
      for (int e = d + 1; e < ndim; ++e) {
        off.push_back(0);
        shp.push_back(shape[e]);
      }
      out.emplace_back(std::move(off), std::move(shp));
    };
    const int64_t s = strides[d];
    int64_t r0 = a / s;
    const int64_t r1 = b / s;
    if (r0 == r1) {  // Within one row of dim d.
      prefix.push_back(r0);
      self(self, d + 1, std::move(prefix), a - r0 * s, b - r0 * s);
      return;
    }
    if (a % s != 0) {  // Head: the tail part of row r0.
      Shape p = prefix;
      p.push_back(r0);
      self(self, d + 1, std::move(p), a - r0 * s, s);
      ++r0;
    }
    if (r1 > r0) box_at(r0, r1);
    if (b % s != 0) {  // Tail: the first part of row r1.
      prefix.push_back(r1);
      self(self, d + 1, std::move(prefix), 0, b - r1 * s);
    }
  };
  emit(emit, 0, Shape{}, start, end);
  return out;
}

absl::Status ValidateLayout(const Shape& global_shape, absl::Span<const RankChunks> ranks,
                            int64_t num_partials) {
  if (absl::Status s = ValidateShape(global_shape); !s.ok()) return s;
  if (num_partials < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_partials ", num_partials, " < 1"));
  }
  const int ndim = static_cast<int>(global_shape.size());
  const int64_t total = Box::Whole(global_shape).Volume();
  // Keyed by partial index, not a vector of num_partials: that count comes from the caller
  // and may be huge.
  absl::flat_hash_map<int64_t, std::vector<RankedBox>> per_partial;
  absl::flat_hash_map<int64_t, bool> seen_rank;
  for (const RankChunks& rc : ranks) {
    if (rc.rank < 0) return absl::InvalidArgumentError(absl::StrCat("rank ", rc.rank, " < 0"));
    if (!seen_rank.emplace(rc.rank, true).second) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rc.rank, " is listed twice"));
    }
    if (rc.local_elements < 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rc.rank, " local buffer of ",
                                                     rc.local_elements, " elements is negative"));
    }
    std::vector<std::pair<int64_t, int64_t>> local;  // [begin, end) in the local buffer.
    for (const Chunk& c : rc.chunks) {
      if (!InBoundsNoOverflow(c.box, global_shape)) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rc.rank, " chunk ", UncheckedBoxString(c.box),
                         " is out of bounds of tensor ", ShapeToString(global_shape)));
      }
      if (c.partial_index < 0 || c.partial_index >= num_partials) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rc.rank, " chunk ", c.box.ToString(), " has partial index ",
                         c.partial_index, " outside [0, ", num_partials, ")"));
      }
      const int64_t v = c.box.Volume();
      if (c.local_offset < 0 || c.local_offset > rc.local_elements - v) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rc.rank, " chunk ", c.box.ToString(), " at local offset ", c.local_offset,
            " does not fit its local buffer of ", rc.local_elements, " elements"));
      }
      if (v == 0) continue;
      local.emplace_back(c.local_offset, c.local_offset + v);
      per_partial[c.partial_index].push_back({c.box, rc.rank});
    }
    std::sort(local.begin(), local.end());
    for (size_t i = 1; i < local.size(); ++i) {
      if (local[i].first < local[i - 1].second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rc.rank, " has two chunks sharing local elements [", local[i].first, ", ",
            std::min(local[i].second, local[i - 1].second), ")"));
      }
    }
  }
  // A non-empty in-bounds box implies total > 0, so with total == 0 there is nothing to
  // check; otherwise the loop ends at the first partial index without chunks, so it runs at
  // most per_partial.size() + 1 times whatever num_partials is.
  for (int64_t p = 0; p < num_partials && total > 0; ++p) {
    auto it = per_partial.find(p);
    if (it == per_partial.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunks cover 0 of the ", total, " elements of tensor ", ShapeToString(global_shape),
          num_partials > 1 ? absl::StrCat(" (partial contribution ", p, ")") : ""));
    }
    std::vector<RankedBox>& boxes = it->second;
    std::sort(boxes.begin(), boxes.end(), [](const RankedBox& a, const RankedBox& b) {
      if (a.box != b.box) return a.box < b.box;
      return a.rank < b.rank;
    });
    // Identical replicas are fine across ranks, but one rank holding a box twice is not.
    std::vector<RankedBox> unique;
    for (size_t i = 0; i < boxes.size(); ++i) {
      if (i > 0 && boxes[i].box == boxes[i - 1].box) {
        if (boxes[i].rank == boxes[i - 1].rank) {
          return absl::InvalidArgumentError(absl::StrCat("rank ", boxes[i].rank, " holds chunk ",
                                                         boxes[i].box.ToString(), " twice"));
        }
        continue;
      }
      unique.push_back(boxes[i]);
    }
    if (absl::Status s = CheckNoOverlap(unique, ndim); !s.ok()) return s;
    int64_t covered = 0;
    for (const RankedBox& b : unique) covered += b.box.Volume();
    if (covered != total) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks cover ", covered, " of the ", total, " elements of tensor ",
                       ShapeToString(global_shape),
                       num_partials > 1 ? absl::StrCat(" (partial contribution ", p, ")") : ""));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Layout> Layout::FromPlacements(const DeviceMesh& mesh, const Shape& global_shape,
                                              absl::Span<const Placement> placements) {
  if (absl::Status s = ValidateShape(global_shape); !s.ok()) return s;
  if (mesh.size() == 0) return absl::InvalidArgumentError("mesh is empty");
  if (static_cast<int>(placements.size()) != mesh.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat("placements '", PlacementsToString(placements),
                                                   "' have ", placements.size(), " items but ",
                                                   mesh.ToString(), " has ", mesh.ndim(), " dims"));
  }
  const int ndim = static_cast<int>(global_shape.size());
  std::vector<Placement> norm(placements.begin(), placements.end());
  bool have_partial = false;
  ReduceOp op = ReduceOp::kSum;
  for (size_t i = 0; i < norm.size(); ++i) {
    Placement& p = norm[i];
    if (p.is_shard()) {
      if (p.dim < -ndim || p.dim >= ndim) {
        return absl::InvalidArgumentError(
            absl::StrCat("placement ", p.ToString(), " at mesh dim ", i, ": tensor of shape ",
                         ShapeToString(global_shape), " has ", ndim, " dims"));
      }
      if (p.dim < 0) p.dim += ndim;
      if (!p.sizes.empty() && static_cast<int64_t>(p.sizes.size()) != mesh.shape(i)) {
        return absl::InvalidArgumentError(
            absl::StrCat("placement ", p.ToString(), " at mesh dim ", i, " has ", p.sizes.size(),
                         " sizes but the mesh dim has ", mesh.shape(i), " positions"));
      }
    } else if (p.is_partial()) {
      if (have_partial && p.op != op) {
        return absl::InvalidArgumentError(
            absl::StrCat("placements '", PlacementsToString(placements),
                         "' mix partial reduce ops; all Partial dims must use the same op"));
      }
      have_partial = true;
      op = p.op;
    }
  }
  auto rep = std::make_shared<Rep>();
  rep->global_shape_ = global_shape;
  rep->mesh_ = mesh;
  rep->placements_ = norm;
  rep->partial_op_ = op;
  for (size_t i = 0; i < norm.size(); ++i) {
    if (norm[i].is_partial()) rep->num_partials_ *= mesh.shape(i);
  }
  rep->ranks_.reserve(mesh.size());
  for (int64_t idx = 0; idx < mesh.size(); ++idx) {
    RankChunks rc;
    rc.rank = mesh.ranks()[idx];
    rc.coord = mesh.CoordAtIndex(idx);
    Box box = Box::Whole(global_shape);
    Shape off = box.offset(), shp = box.shape();
    int64_t partial_index = 0;
    for (size_t i = 0; i < norm.size(); ++i) {
      const Placement& p = norm[i];
      const int64_t k = mesh.shape(i), j = rc.coord[i];
      if (p.is_partial()) partial_index = partial_index * k + j;
      if (!p.is_shard()) continue;
      const int d = p.dim;
      const int64_t n = shp[d];
      int64_t start, size;
      if (p.sizes.empty()) {
        std::tie(start, size) = ChunkPiece(n, k, j);
      } else {
        // Sizes may come from a caller that built the Placement directly: reject negative
        // values and sum with overflow checks.
        int64_t sum = 0;
        bool overflow = false;
        for (int64_t s : p.sizes) {
          if (s < 0) {
            return absl::InvalidArgumentError(absl::StrCat(
                "placement ", p.ToString(), " at mesh dim ", i, ": size ", s, " is negative"));
          }
          if (!overflow) overflow = __builtin_add_overflow(sum, s, &sum);
        }
        if (overflow || sum != n) {
          return absl::InvalidArgumentError(
              absl::StrCat("placement ", p.ToString(), " at mesh dim ", i, ": sizes sum to ",
                           overflow ? std::string("more than int64 max") : absl::StrCat(sum),
                           " but the extent of tensor dim ", d, " there is ", n));
        }
        start = std::accumulate(p.sizes.begin(), p.sizes.begin() + j, int64_t{0});
        size = p.sizes[j];
      }
      off[d] += start;
      shp[d] = size;
    }
    Chunk c{Box(std::move(off), std::move(shp)), 0, partial_index};
    rc.local_elements = c.box.Volume();
    rc.chunks.push_back(std::move(c));
    rep->index_of_rank_[rc.rank] = idx;
    rep->ranks_.push_back(std::move(rc));
  }
  Layout layout;
  layout.rep_ = std::move(rep);
  return layout;
}

absl::StatusOr<Layout> Layout::FromFlat(const DeviceMesh& mesh, const Shape& global_shape,
                                        const FlatSpec& spec) {
  if (absl::Status s = ValidateShape(global_shape); !s.ok()) return s;
  if (static_cast<int64_t>(spec.size()) != mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat("flat spec has ", spec.size(),
                                                   " rank groups but ", mesh.ToString(), " has ",
                                                   mesh.size(), " ranks"));
  }
  const int64_t total = Box::Whole(global_shape).Volume();
  std::vector<RankChunks> ranks;
  for (int64_t idx = 0; idx < mesh.size(); ++idx) {
    RankChunks rc;
    rc.rank = mesh.ranks()[idx];
    rc.coord = mesh.CoordAtIndex(idx);
    for (const FlatRange& r : spec[idx]) {
      if (r.start < 0 || r.end < r.start || r.end > total) {
        return absl::InvalidArgumentError(
            absl::StrCat("flat range ", r.start, ":", r.end, " of rank ", rc.rank,
                         " is outside the flattened tensor [0, ", total, ")"));
      }
      for (Box& b : FlatRangeToBoxes(global_shape, r.start, r.end)) {
        const int64_t v = b.Volume();
        rc.chunks.push_back(Chunk{std::move(b), rc.local_elements, 0});
        rc.local_elements += v;
      }
    }
    ranks.push_back(std::move(rc));
  }
  if (absl::Status s = ValidateLayout(global_shape, ranks); !s.ok()) return s;
  std::shared_ptr<Rep> rep = ChunkRep(global_shape, std::move(ranks), 1, ReduceOp::kSum);
  rep->mesh_ = mesh;
  rep->flat_spec_ = spec;
  Layout layout;
  layout.rep_ = std::move(rep);
  return layout;
}

absl::StatusOr<Layout> Layout::FromChunks(const Shape& global_shape, std::vector<RankChunks> ranks,
                                          int64_t num_partials, ReduceOp partial_op) {
  if (absl::Status s = ValidateLayout(global_shape, ranks, num_partials); !s.ok()) return s;
  Layout layout;
  layout.rep_ = ChunkRep(global_shape, std::move(ranks), num_partials, partial_op);
  return layout;
}

std::shared_ptr<Layout::Rep> Layout::ChunkRep(const Shape& global_shape,
                                              std::vector<RankChunks> ranks, int64_t num_partials,
                                              ReduceOp partial_op) {
  auto rep = std::make_shared<Rep>();
  rep->global_shape_ = global_shape;
  rep->num_partials_ = num_partials;
  rep->partial_op_ = partial_op;
  rep->ranks_ = std::move(ranks);
  for (size_t i = 0; i < rep->ranks_.size(); ++i) {
    rep->index_of_rank_[rep->ranks_[i].rank] = static_cast<int64_t>(i);
  }
  return rep;
}

const std::shared_ptr<const Layout::Rep>& Layout::EmptyRep() {
  static const auto* empty = new std::shared_ptr<const Rep>(std::make_shared<Rep>());
  return *empty;
}

const RankChunks* Layout::Find(int64_t rank) const {
  auto it = rep_->index_of_rank_.find(rank);
  return it == rep_->index_of_rank_.end() ? nullptr : &rep_->ranks_[it->second];
}

std::vector<int64_t> Layout::RankIds() const {
  std::vector<int64_t> ids;
  ids.reserve(rep_->ranks_.size());
  for (const RankChunks& rc : rep_->ranks_) ids.push_back(rc.rank);
  return ids;
}

std::string Layout::SpecString() const {
  std::string where = rep_->mesh_.has_value()
                          ? absl::StrCat(" on mesh ", rep_->mesh_->ShapeString())
                          : absl::StrCat(" on ", rep_->ranks_.size(), " ranks");
  if (!rep_->placements_.empty()) return absl::StrCat(PlacementsToString(rep_->placements_), where);
  if (rep_->flat_spec_.has_value())
    return absl::StrCat("flat ", FlatSpecToString(*rep_->flat_spec_), where);
  return absl::StrCat("chunks", where);
}

std::string Layout::Fingerprint() const {
  std::string fp = absl::StrCat(ShapeToString(rep_->global_shape_), "|", rep_->num_partials_,
                                ReduceOpName(rep_->partial_op_));
  if (!rep_->placements_.empty()) {
    // Exact and compact: placement layouts are a function of these.
    absl::StrAppend(&fp, "|P|", rep_->mesh_->ShapeString(), "|",
                    absl::StrJoin(rep_->mesh_->ranks(), ","), "|",
                    PlacementsToString(rep_->placements_));
    return fp;
  }
  for (const RankChunks& rc : rep_->ranks_) {
    absl::StrAppend(&fp, "|", rc.rank, ":", rc.local_elements);
    for (const Chunk& c : rc.chunks) {
      absl::StrAppend(&fp, ";", absl::StrJoin(c.box.offset(), ","), "+",
                      absl::StrJoin(c.box.shape(), ","), "@", c.local_offset, "p", c.partial_index);
    }
  }
  return fp;
}

bool operator==(const Layout& a, const Layout& b) {
  if (a.rep_ == b.rep_) return true;
  if (a.rep_->global_shape_ != b.rep_->global_shape_ ||
      a.rep_->num_partials_ != b.rep_->num_partials_ ||
      a.rep_->partial_op_ != b.rep_->partial_op_ ||
      a.rep_->ranks_.size() != b.rep_->ranks_.size()) {
    return false;
  }
  for (size_t i = 0; i < a.rep_->ranks_.size(); ++i) {
    if (a.rep_->ranks_[i].rank != b.rep_->ranks_[i].rank ||
        a.rep_->ranks_[i].local_elements != b.rep_->ranks_[i].local_elements ||
        a.rep_->ranks_[i].chunks != b.rep_->ranks_[i].chunks) {
      return false;
    }
  }
  return true;
}

}  // namespace shardcoord
