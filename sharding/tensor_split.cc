#include "sharding/tensor_split.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "sharding/box.h"
#include "sharding/box_copy.h"
#include "sharding/box_slices.h"

namespace shardcoord {
namespace {

// Whether chunks of this partial contribution carry the values when chunking a full tensor:
// a sum counts them once, the other ops see the same value from every contribution.
bool HoldsValues(const Layout& layout, const Chunk& chunk) {
  return !layout.is_partial() || layout.partial_op() != ReduceOp::kSum || chunk.partial_index == 0;
}

absl::StatusOr<std::vector<char>> BuildLocal(const Layout& layout, const RankChunks& rc,
                                             const void* full, int64_t element_size) {
  if (element_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("element size ", element_size, " <= 0"));
  }
  absl::StatusOr<int64_t> bytes = CheckedMul(rc.local_elements, element_size);
  if (!bytes.ok()) return bytes.status();
  std::vector<char> buf(*bytes, 0);
  const Box whole = Box::Whole(layout.global_shape());
  for (const Chunk& c : rc.chunks) {
    if (!HoldsValues(layout, c)) continue;
    if (absl::Status s =
            PackBox(c.box, full, whole, buf.data() + c.local_offset * element_size, element_size);
        !s.ok()) {
      return s;
    }
  }
  return buf;
}

}  // namespace

absl::StatusOr<std::vector<std::vector<char>>> ChunkUnsharded(const Layout& layout,
                                                              const void* full,
                                                              int64_t element_size) {
  std::vector<std::vector<char>> out;
  out.reserve(layout.ranks().size());
  for (const RankChunks& rc : layout.ranks()) {
    absl::StatusOr<std::vector<char>> buf = BuildLocal(layout, rc, full, element_size);
    if (!buf.ok()) return buf.status();
    out.push_back(*std::move(buf));
  }
  return out;
}

absl::StatusOr<std::vector<char>> ShardedChunk(const Layout& layout, int64_t rank, const void* full,
                                               int64_t element_size) {
  const RankChunks* rc = layout.Find(rank);
  if (rc == nullptr) {
    return absl::NotFoundError(absl::StrCat("rank ", rank, " is not in the layout (ranks ",
                                            absl::StrJoin(layout.RankIds(), ","), ")"));
  }
  return BuildLocal(layout, *rc, full, element_size);
}

absl::Status AssembleFull(const Layout& layout,
                          const std::vector<const void*>& local_buffers_by_rank_index,
                          int64_t element_size, void* full) {
  if (element_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("element size ", element_size, " <= 0"));
  }
  if (layout.is_partial()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "layout holds ", layout.num_partials(), " partial contributions (",
        ReduceOpName(layout.partial_op()), "); assembling it needs a reduction, not a copy"));
  }
  if (local_buffers_by_rank_index.size() != layout.ranks().size()) {
    return absl::InvalidArgumentError(absl::StrCat("got ", local_buffers_by_rank_index.size(),
                                                   " local buffers for a layout of ",
                                                   layout.ranks().size(), " ranks"));
  }
  const Box whole = Box::Whole(layout.global_shape());
  for (size_t i = 0; i < layout.ranks().size(); ++i) {
    const RankChunks& rc = layout.ranks()[i];
    const char* buf = static_cast<const char*>(local_buffers_by_rank_index[i]);
    for (const Chunk& c : rc.chunks) {
      if (c.box.Empty()) continue;
      if (buf == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "local buffer of rank ", rc.rank, " is null but it holds chunk ", c.box.ToString()));
      }
      if (absl::Status s =
              UnpackBox(c.box, buf + c.local_offset * element_size, full, whole, element_size);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Layout>> SplitLayout(const Layout& layout, int dim,
                                                absl::Span<const int64_t> sections) {
  const int ndim = layout.ndim();
  const Shape& shape = layout.global_shape();
  if (dim < -ndim || dim >= ndim) {
    return absl::InvalidArgumentError(absl::StrCat("split dim ", dim, " is out of range for ",
                                                   "tensor of shape ", ShapeToString(shape)));
  }
  if (dim < 0) dim += ndim;
  int64_t sum = 0;
  for (int64_t s : sections) {
    if (s < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("split sections ", ShapeToString(sections), " have a negative size ", s));
    }
    sum += s;
    if (sum > shape[dim]) break;  // Also keeps the sum from overflowing.
  }
  if (sum != shape[dim]) {
    return absl::InvalidArgumentError(
        absl::StrCat("split sections ", ShapeToString(sections), " do not sum to ", shape[dim],
                     ", the extent of dim ", dim, " of tensor ", ShapeToString(shape)));
  }
  std::vector<Layout> pieces;
  pieces.reserve(sections.size());
  int64_t start = 0;
  for (int64_t size : sections) {
    Shape piece_shape = shape;
    piece_shape[dim] = size;
    Shape piece_offset(shape.size(), 0);
    piece_offset[dim] = start;
    absl::StatusOr<Layout> l = RestrictLayout(layout, Box(piece_offset, piece_shape), piece_shape);
    if (!l.ok()) return l.status();
    pieces.push_back(*std::move(l));
    start += size;
  }
  return pieces;
}

absl::StatusOr<std::vector<Layout>> SplitLayoutEvery(const Layout& layout, int dim,
                                                     int64_t split_size) {
  if (split_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("split size ", split_size, " <= 0"));
  }
  const int ndim = layout.ndim();
  if (dim < -ndim || dim >= ndim) {
    return absl::InvalidArgumentError(absl::StrCat("split dim ", dim, " is out of range for ",
                                                   "tensor of shape ",
                                                   ShapeToString(layout.global_shape())));
  }
  const int64_t n = layout.global_shape()[dim < 0 ? dim + ndim : dim];
  std::vector<int64_t> sections;
  for (int64_t at = 0; at < n;) {  // Steps by the piece, so `at` cannot overflow.
    sections.push_back(std::min(split_size, n - at));
    at += sections.back();
  }
  if (sections.empty()) sections.push_back(0);
  return SplitLayout(layout, dim, sections);
}

}  // namespace shardcoord
