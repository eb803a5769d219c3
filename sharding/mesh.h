#ifndef SHARDCOORD_SHARDING_MESH_H_
#define SHARDCOORD_SHARDING_MESH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "sharding/box.h"

namespace shardcoord {

// An N-d grid of global ranks, as torch's DeviceMesh. Position (i, j, ...) holds the rank
// ranks()[row-major index]; by default ranks are 0..size-1 in row-major order, but any
// permutation of any distinct non-negative ranks is allowed.
class DeviceMesh {
 public:
  DeviceMesh() = default;

  // `ranks` empty means 0..size-1. `dim_names` empty means unnamed; otherwise one distinct
  // non-empty name per dim.
  static absl::StatusOr<DeviceMesh> Create(Shape shape, std::vector<int64_t> ranks = {},
                                           std::vector<std::string> dim_names = {});

  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size() const { return static_cast<int64_t>(ranks_.size()); }
  const Shape& shape() const { return shape_; }
  int64_t shape(int d) const { return shape_[d]; }
  const std::vector<int64_t>& ranks() const { return ranks_; }
  const std::vector<std::string>& dim_names() const { return dim_names_; }

  bool Contains(int64_t rank) const { return index_of_rank_.contains(rank); }
  // Rank at a mesh coordinate.
  absl::StatusOr<int64_t> RankAt(absl::Span<const int64_t> coord) const;
  // Mesh coordinate of a rank (NOT_FOUND if the rank is not in the mesh).
  absl::StatusOr<Shape> CoordOf(int64_t rank) const;
  // Coordinate of the i-th position in row-major order.
  Shape CoordAtIndex(int64_t index) const;
  // Index of a dim by name, or a decimal dim number.
  absl::StatusOr<int> DimIndex(absl::string_view name) const;

  // The process groups along `dims`: ranks that differ only in the coordinates of `dims`,
  // each group ordered by those coordinates (row-major among them), groups ordered by the
  // remaining coordinates. For dp=2 x tp=4 over 0..7: dims {1} -> {0,1,2,3},{4,5,6,7};
  // dims {0} -> {0,4},{1,5},{2,6},{3,7}; dims {0,1} -> one group of all eight.
  absl::StatusOr<std::vector<std::vector<int64_t>>> SubGroups(absl::Span<const int> dims) const;
  // The group along `dims` that contains `rank`.
  absl::StatusOr<std::vector<int64_t>> GroupOf(int64_t rank, absl::Span<const int> dims) const;

  // "2x4"
  std::string ShapeString() const;
  // "mesh 2x4 (dp, tp) ranks [0..7]"
  std::string ToString() const;

  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b) {
    return a.shape_ == b.shape_ && a.ranks_ == b.ranks_ && a.dim_names_ == b.dim_names_;
  }

 private:
  Shape shape_;
  std::vector<int64_t> ranks_;
  std::vector<std::string> dim_names_;
  absl::flat_hash_map<int64_t, int64_t> index_of_rank_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_MESH_H_
