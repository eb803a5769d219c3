#include "sharding/box_slices.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "sharding/field_status.h"
#include "sharding/spatial_index.h"

namespace shardcoord {
namespace {

using field_status::Bad;
using field_status::Sub;

// `shape` at `rank` under the rank rule: leading 1s added, or leading 1s dropped; nullopt when
// a dropped dim is not 1.
std::optional<Shape> AtRank(const Shape& shape, size_t rank) {
  if (shape.size() <= rank) {
    Shape out(rank - shape.size(), 1);
    out.insert(out.end(), shape.begin(), shape.end());
    return out;
  }
  const size_t drop = shape.size() - rank;
  for (size_t d = 0; d < drop; ++d) {
    if (shape[d] != 1) return std::nullopt;
  }
  return Shape(shape.begin() + drop, shape.end());
}

// Offsets of `box_shape` at `offset` inside `shape`: same rank, non-negative, in range.
absl::Status CheckBoxIn(const Shape& offset, const Shape& box_shape, const Shape& shape,
                        const std::string& field, const std::string& what) {
  if (offset.size() != shape.size()) {
    return Bad(field, "offset ", ShapeToString(offset), " has ", offset.size(), " dims; ", what,
               " shape ", ShapeToString(shape), " has ", shape.size());
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (offset[d] < 0 || box_shape[d] < 0 || offset[d] > shape[d] ||
        box_shape[d] > shape[d] - offset[d]) {
      return Bad(field, "box ", Box(offset, box_shape).ToString(), " is out of range of ", what,
                 " shape ", ShapeToString(shape));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SliceBoxes> ResolveSlice(const SliceMember& m, const std::string& field) {
  SliceBoxes out;
  const std::string src_name = absl::StrCat("src '", m.src, "'");
  const std::string dst_name = absl::StrCat("dst '", m.dst, "'");
  if (m.src_offset.has_value() != m.src_box_shape.has_value()) {
    return m.src_offset.has_value()
               ? Bad(Sub(field, "src_shape"), "missing: src_offset ", ShapeToString(*m.src_offset),
                     " needs the shape of the box it starts")
               : Bad(Sub(field, "src_offset"), "missing: src_shape ",
                     ShapeToString(*m.src_box_shape), " needs the offset of its box");
  }
  // The box of src read.
  if (m.src_offset.has_value()) {
    const std::string f = Sub(field, "src_offset");
    if (m.src_box_shape->size() != m.src_shape.size()) {
      return Bad(Sub(field, "src_shape"), ShapeToString(*m.src_box_shape), " has ",
                 m.src_box_shape->size(), " dims; ", src_name, " shape ",
                 ShapeToString(m.src_shape), " has ", m.src_shape.size());
    }
    if (absl::Status s = CheckBoxIn(*m.src_offset, *m.src_box_shape, m.src_shape, f, src_name);
        !s.ok()) {
      return s;
    }
    out.src = Box(*m.src_offset, *m.src_box_shape);
    out.sliced_src = true;
  } else {
    out.src = Box::Whole(m.src_shape);
  }
  // The box of dst written: src's box's shape at dst's rank.
  const Shape& moved = out.src.shape();
  if (m.dst_offset.has_value()) {
    const std::string f = Sub(field, "dst_offset");
    std::optional<Shape> box_shape = AtRank(moved, m.dst_shape.size());
    if (!box_shape.has_value()) {
      return Bad(f, out.sliced_src ? "src_shape " : absl::StrCat(src_name, " shape "),
                 ShapeToString(moved), " has more dims than ", dst_name, " shape ",
                 ShapeToString(m.dst_shape), " and they are not leading 1s");
    }
    if (absl::Status s = CheckBoxIn(*m.dst_offset, *box_shape, m.dst_shape, f, dst_name); !s.ok()) {
      return s;
    }
    out.dst = Box(*m.dst_offset, *std::move(box_shape));
    out.sliced_dst = true;
  } else {
    std::optional<Shape> as_dst = AtRank(moved, m.dst_shape.size());
    const bool sliced = out.sliced_src;
    if (!as_dst.has_value() || *as_dst != m.dst_shape || (!sliced && moved != m.dst_shape)) {
      return Bad(sliced ? Sub(field, "src_shape") : Sub(field, "dst"),
                 sliced ? "box shape " : absl::StrCat(src_name, " shape "), ShapeToString(moved),
                 " differs from ", dst_name, " shape ", ShapeToString(m.dst_shape),
                 sliced ? "" : " (give dst_offset to write a box of dst)");
    }
    out.dst = Box::Whole(m.dst_shape);
  }
  return out;
}

absl::StatusOr<std::vector<SliceBoxes>> ResolveSlices(const std::vector<SliceMember>& members,
                                                      const std::string& field) {
  std::vector<SliceBoxes> out;
  out.reserve(members.size());
  // dst -> the members writing it, in order.
  std::map<std::string, std::vector<size_t>> by_dst;
  for (size_t i = 0; i < members.size(); ++i) {
    absl::StatusOr<SliceBoxes> boxes =
        ResolveSlice(members[i], field_status::Index(field, static_cast<int64_t>(i)));
    if (!boxes.ok()) return boxes.status();
    out.push_back(*std::move(boxes));
    by_dst[members[i].dst].push_back(i);
  }
  // Overlaps within each dst through a BoxIndex (sharding/spatial_index.h): a grid of experts
  // costs O(n log n), not n^2. The pair reported is the one whose later member comes first, as
  // checking the members one by one against those before would find.
  std::optional<std::pair<size_t, size_t>> worst;  // (later, earlier)
  for (const auto& [dst, writers] : by_dst) {
    if (writers.size() < 2) continue;
    std::vector<SourceBox> all;
    for (size_t i : writers) {
      if (out[i].dst.Empty()) continue;
      SourceBox b;
      b.box = &out[i].dst;
      b.holders_begin = i;  // The member.
      all.push_back(b);
    }
    BoxIndex index;
    index.Build(all, 0, all.size(), out[writers[0]].dst.ndim());
    for (size_t k = 0; k < all.size(); ++k) {
      index.ForEachOverlap(*all[k].box, [&](size_t hit) {
        if (hit == k) return;
        const size_t a = all[k].holders_begin, b = all[hit].holders_begin;
        const std::pair<size_t, size_t> pair(std::max(a, b), std::min(a, b));
        if (!worst.has_value() || pair < *worst) worst = pair;
      });
    }
  }
  if (worst.has_value()) {
    const auto [i, j] = *worst;
    const std::string fi = field_status::Index(field, static_cast<int64_t>(i));
    return Bad(out[i].sliced_dst ? Sub(fi, "dst_offset") : Sub(fi, "dst"), "box ",
               out[i].dst.ToString(), " overlaps ",
               field_status::Index(field, static_cast<int64_t>(j)), "'s ", out[j].dst.ToString(),
               " of dst '", members[i].dst, "'");
  }
  return out;
}

absl::StatusOr<Layout> RestrictLayout(const Layout& layout, const Box& box,
                                      const Shape& view_shape) {
  const Shape& shape = layout.global_shape();
  if (box.ndim() != static_cast<int>(shape.size()) || !box.InBounds(shape)) {
    return absl::InvalidArgumentError(
        absl::StrCat("box ", box.ToString(), " is out of range of shape ", ShapeToString(shape)));
  }
  std::optional<Shape> as_box = AtRank(view_shape, shape.size());
  if (!as_box.has_value() || *as_box != box.shape()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape ", ShapeToString(view_shape), " is not that of box ", box.ToString()));
  }
  std::vector<RankChunks> ranks;
  ranks.reserve(layout.ranks().size());
  for (const RankChunks& rc : layout.ranks()) {
    RankChunks r;
    r.rank = rc.rank;
    r.coord = rc.coord;
    for (const Chunk& c : rc.chunks) {
      Box in = c.box.Intersect(box);
      if (in.Empty()) continue;
      Shape offset = in.offset();
      for (size_t d = 0; d < offset.size(); ++d) offset[d] -= box.offset(d);
      // At the view's rank: the dropped leading dims have offset 0 and extent 1 in the box.
      Shape o;
      if (offset.size() > view_shape.size()) {
        o.assign(offset.end() - view_shape.size(), offset.end());
      } else {
        o.assign(view_shape.size() - offset.size(), 0);
        o.insert(o.end(), offset.begin(), offset.end());
      }
      Chunk out;
      out.box = Box(std::move(o), *AtRank(in.shape(), view_shape.size()));
      out.local_offset = r.local_elements;
      out.partial_index = c.partial_index;
      r.local_elements += out.box.Volume();
      r.chunks.push_back(std::move(out));
    }
    ranks.push_back(std::move(r));
  }
  return Layout::FromChunks(view_shape, std::move(ranks), layout.num_partials(),
                            layout.partial_op());
}

Box MapBox(const Box& region, const Box& from, const Box& to) {
  Shape rel = region.offset();
  for (size_t d = 0; d < rel.size(); ++d) rel[d] -= from.offset(d);
  const size_t rank = to.ndim();
  Shape offset;
  if (rel.size() > rank) {
    offset.assign(rel.end() - rank, rel.end());
  } else {
    offset.assign(rank - rel.size(), 0);
    offset.insert(offset.end(), rel.begin(), rel.end());
  }
  for (size_t d = 0; d < rank; ++d) offset[d] += to.offset(d);
  return Box(std::move(offset), *AtRank(region.shape(), rank));
}

absl::StatusOr<Box> PlaceBox(const Box& box, const Shape& offset) {
  if (static_cast<size_t>(box.ndim()) > offset.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("box ", box.ToString(), " has more dims than offset ", ShapeToString(offset)));
  }
  const size_t pad = offset.size() - box.ndim();
  Shape o(offset.size(), 0), sh(offset.size(), 1);
  for (size_t d = 0; d < static_cast<size_t>(box.ndim()); ++d) {
    o[pad + d] = box.offset(d);
    sh[pad + d] = box.shape(d);
  }
  for (size_t d = 0; d < offset.size(); ++d) {
    absl::StatusOr<int64_t> at = CheckedAdd(o[d], offset[d]);
    if (!at.ok()) return at.status();
    o[d] = *at;
    if (absl::StatusOr<int64_t> end = CheckedAdd(*at, sh[d]); !end.ok()) return end.status();
  }
  // Coordinates may be negative: the parts there lie outside every chunk of the frame.
  return Box(std::move(o), std::move(sh));
}

std::vector<Box> SubtractBoxes(const Box& box, const std::vector<Box>& cuts) {
  std::vector<Box> left;
  if (!box.Empty()) left.push_back(box);
  for (const Box& cut : cuts) {
    if (cut.ndim() != box.ndim() || cut.Empty()) continue;
    std::vector<Box> next;
    for (const Box& b : left) {
      const Box in = b.Intersect(cut);
      if (in.Empty()) {
        next.push_back(b);
        continue;
      }
      // Peel the slabs of b below and above `in` dim by dim; what remains is `in`.
      Box rest = b;
      for (int d = 0; d < b.ndim(); ++d) {
        if (rest.offset(d) < in.offset(d)) {
          Shape sh = rest.shape();
          sh[d] = in.offset(d) - rest.offset(d);
          next.emplace_back(rest.offset(), sh);
        }
        if (in.end(d) < rest.end(d)) {
          Shape o = rest.offset();
          Shape sh = rest.shape();
          o[d] = in.end(d);
          sh[d] = rest.end(d) - in.end(d);
          next.emplace_back(o, sh);
        }
        Shape o = rest.offset();
        Shape sh = rest.shape();
        o[d] = in.offset(d);
        sh[d] = in.shape(d);
        rest = Box(o, sh);
      }
    }
    left = std::move(next);
  }
  return left;
}

}  // namespace shardcoord
