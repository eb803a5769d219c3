#include "sharding/mesh.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {

absl::StatusOr<DeviceMesh> DeviceMesh::Create(Shape shape, std::vector<int64_t> ranks,
                                              std::vector<std::string> dim_names) {
  if (shape.empty()) return absl::InvalidArgumentError("mesh shape must have at least one dim");
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh shape ", ShapeToString(shape), ": dim ", d, " must be positive"));
    }
  }
  absl::StatusOr<int64_t> size = CheckedProduct(shape);
  if (!size.ok()) return size.status();
  if (*size > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh shape ", ShapeToString(shape), " has more than 2^31 positions"));
  }
  DeviceMesh mesh;
  if (ranks.empty()) {
    ranks.resize(*size);
    for (int64_t i = 0; i < *size; ++i) ranks[i] = i;
  }
  if (static_cast<int64_t>(ranks.size()) != *size) {
    return absl::InvalidArgumentError(absl::StrCat("mesh shape ", ShapeToString(shape), " has ",
                                                   *size, " positions but ", ranks.size(),
                                                   " ranks were given"));
  }
  mesh.index_of_rank_.reserve(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("mesh rank ", ranks[i], " is negative"));
    }
    if (!mesh.index_of_rank_.emplace(ranks[i], static_cast<int64_t>(i)).second) {
      return absl::InvalidArgumentError(absl::StrCat("mesh rank ", ranks[i], " appears twice"));
    }
  }
  if (!dim_names.empty()) {
    if (dim_names.size() != shape.size()) {
      return absl::InvalidArgumentError(absl::StrCat("mesh has ", shape.size(), " dims but ",
                                                     dim_names.size(), " dim names were given"));
    }
    absl::flat_hash_set<std::string> seen;
    for (const std::string& n : dim_names) {
      if (n.empty()) return absl::InvalidArgumentError("mesh dim name must not be empty");
      if (!seen.insert(n).second) {
        return absl::InvalidArgumentError(absl::StrCat("mesh dim name '", n, "' appears twice"));
      }
    }
  }
  mesh.shape_ = std::move(shape);
  mesh.ranks_ = std::move(ranks);
  mesh.dim_names_ = std::move(dim_names);
  return mesh;
}

absl::StatusOr<int64_t> DeviceMesh::RankAt(absl::Span<const int64_t> coord) const {
  if (coord.size() != shape_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("coordinate ", ShapeToString(coord), " does not match mesh ", ShapeString()));
  }
  int64_t index = 0;
  for (size_t d = 0; d < coord.size(); ++d) {
    if (coord[d] < 0 || coord[d] >= shape_[d]) {
      return absl::OutOfRangeError(
          absl::StrCat("coordinate ", ShapeToString(coord), " is outside mesh ", ShapeString()));
    }
    index = index * shape_[d] + coord[d];
  }
  return ranks_[index];
}

Shape DeviceMesh::CoordAtIndex(int64_t index) const {
  Shape coord(shape_.size());
  for (int d = ndim() - 1; d >= 0; --d) {
    coord[d] = index % shape_[d];
    index /= shape_[d];
  }
  return coord;
}

absl::StatusOr<Shape> DeviceMesh::CoordOf(int64_t rank) const {
  auto it = index_of_rank_.find(rank);
  if (it == index_of_rank_.end()) {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " is not in ", ToString()));
  }
  return CoordAtIndex(it->second);
}

absl::StatusOr<int> DeviceMesh::DimIndex(absl::string_view name) const {
  for (size_t d = 0; d < dim_names_.size(); ++d) {
    if (dim_names_[d] == name) return static_cast<int>(d);
  }
  int d;
  if (absl::SimpleAtoi(name, &d) && d >= 0 && d < ndim()) return d;
  return absl::InvalidArgumentError(
      absl::StrCat("mesh dim '", name, "' is not a dim of ", ToString()));
}

absl::StatusOr<std::vector<std::vector<int64_t>>> DeviceMesh::SubGroups(
    absl::Span<const int> dims) const {
  std::vector<bool> in_group(shape_.size(), false);
  for (int d : dims) {
    if (d < 0 || d >= ndim()) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh dim ", d, " is out of range for ", ToString()));
    }
    if (in_group[d]) return absl::InvalidArgumentError(absl::StrCat("mesh dim ", d, " repeated"));
    in_group[d] = true;
  }
  // Group key: the row-major index over the dims not in the group; position within a group:
  // the row-major index over the group dims (sorted ascending, as torch's DeviceMesh does).
  int64_t group_size = 1;
  for (int d = 0; d < ndim(); ++d) {
    if (in_group[d]) group_size *= shape_[d];
  }
  const int64_t num_groups = size() / group_size;
  std::vector<std::vector<int64_t>> groups(num_groups, std::vector<int64_t>(group_size));
  for (int64_t i = 0; i < size(); ++i) {
    const Shape c = CoordAtIndex(i);
    int64_t g = 0, p = 0;
    for (int d = 0; d < ndim(); ++d) {
      if (in_group[d]) {
        p = p * shape_[d] + c[d];
      } else {
        g = g * shape_[d] + c[d];
      }
    }
    groups[g][p] = ranks_[i];
  }
  return groups;
}

absl::StatusOr<std::vector<int64_t>> DeviceMesh::GroupOf(int64_t rank,
                                                         absl::Span<const int> dims) const {
  absl::StatusOr<std::vector<std::vector<int64_t>>> groups = SubGroups(dims);
  if (!groups.ok()) return groups.status();
  for (auto& g : *groups) {
    if (std::find(g.begin(), g.end(), rank) != g.end()) return std::move(g);
  }
  return absl::NotFoundError(absl::StrCat("rank ", rank, " is not in ", ToString()));
}

std::string DeviceMesh::ShapeString() const { return absl::StrJoin(shape_, "x"); }

std::string DeviceMesh::ToString() const {
  std::string s = absl::StrCat("mesh ", ShapeString());
  if (!dim_names_.empty()) absl::StrAppend(&s, " (", absl::StrJoin(dim_names_, ", "), ")");
  absl::StrAppend(&s, " ranks [");
  if (ranks_.size() <= 16) {
    absl::StrAppend(&s, absl::StrJoin(ranks_, ","));
  } else {
    absl::StrAppend(&s, ranks_.front(), ",...,", ranks_.back());
  }
  return s + "]";
}

}  // namespace shardcoord
