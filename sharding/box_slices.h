#ifndef SHARDCOORD_SHARDING_BOX_SLICES_H_
#define SHARDCOORD_SHARDING_BOX_SLICES_H_

// Slices of fused tensors (issue 28 item 4): a copy member may write its src into a box of a
// larger dst (q, k and v into a fused qkv; experts into a stacked [E, 2I, H]) with
// `dst_offset`, or read a box of a larger src (`src_offset`, `src_shape`) into its dst.
//
// The rank rule: the box and the smaller tensor have the same elements in the same order. A
// box is the larger tensor's rank; the smaller tensor may lack leading dims of extent 1 (an
// expert [2I, H] is the box [1, 2I, H] of a stacked [E, 2I, H] at offset [e, 0, 0]), and
// nothing else: a box [1, 2I, H] of a [2I, H] src, a box whose other dims differ from the
// smaller tensor's, or an offset of another length is INVALID_ARGUMENT.
//
// Pure: no threads, no I/O.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sharding/box.h"
#include "sharding/layout.h"

namespace shardcoord {

// One copy member's slice fields and its tensors' shapes.
struct SliceMember {
  std::string src;
  std::string dst;
  Shape src_shape;  // The src tensor's shape.
  Shape dst_shape;  // The dst tensor's shape.
  // The box of dst written: its offset (dst's rank); the box's shape is src's (or src_shape's
  // when reading a box of src), with leading 1s up to dst's rank.
  std::optional<Shape> dst_offset;
  // The box of src read: offset and shape, both src's rank.
  std::optional<Shape> src_offset;
  std::optional<Shape> src_box_shape;
};

// The boxes one member reads and writes, in the coordinates of src and of dst. Without slice
// fields both are the whole tensor.
struct SliceBoxes {
  Box src;  // src's rank.
  Box dst;  // dst's rank.
  bool sliced_src = false;
  bool sliced_dst = false;
};

// The member's boxes. INVALID_ARGUMENT naming `field` and the member field ("copies[2].dst_offset:
// ..."): an offset or shape of another rank, negative values, a box out of range of its tensor
// ("out of range of dst 'qkv' shape [96, 32]"), src_shape without src_offset or the reverse,
// or boxes whose shapes do not match under the rank rule above. Without slice fields, src and
// dst must have the same shape (an error otherwise, as a Copy's).
absl::StatusOr<SliceBoxes> ResolveSlice(const SliceMember& member, const std::string& field);

// Every member's boxes, in order, and no two members of the same dst writing overlapping boxes
// (a member without dst_offset writes the whole dst): ResolveSlice's errors (the first member
// in order), then overlaps, O(n log n) for a grid of boxes. INVALID_ARGUMENT naming the later
// member
// ("copies[2].dst_offset: box [64:80, 0:32] overlaps copies[1]'s [48:72, 0:32] of dst 'qkv'").
// `field` is the list's name ("copies").
absl::StatusOr<std::vector<SliceBoxes>> ResolveSlices(const std::vector<SliceMember>& members,
                                                      const std::string& field);

// `layout` restricted to `box` and shifted to its origin, as a layout of `view_shape` (the
// box's shape with some leading 1s dropped, see the rank rule): every rank keeps the parts of
// its chunks inside the box (ranks with none keep an empty entry), packed contiguously in chunk
// order in a new local buffer; partial indices and replicas are kept. This is the layout a
// member's data has on dst's ranks before it is written into dst's box (dst_offset), or on
// src's ranks once read out of src's box (src_offset). INVALID_ARGUMENT a box out of range or a
// view_shape that is not the box's shape under the rank rule.
absl::StatusOr<Layout> RestrictLayout(const Layout& layout, const Box& box,
                                      const Shape& view_shape);

// The box of `to` that corresponds to `region` (inside `from`): `from` and `to` have the same
// elements in the same order (shapes equal under the rank rule), so a region of one is a region
// of the other, at `to`'s rank and offset. Used to map a member's piece between src and dst
// coordinates.
Box MapBox(const Box& region, const Box& from, const Box& to);

// Worker-side compose (Worker.ComposeBoxes): `box` placed in a frame of rank offset.size():
// leading dims of offset 0 and extent 1 are added up to that rank, then `offset` is added.
// The result may have negative coordinates (a chunk partly before a box read out of a larger
// tensor); nothing of the frame lies there. INVALID_ARGUMENT a box of higher rank than
// `offset`, or coordinates that overflow.
absl::StatusOr<Box> PlaceBox(const Box& box, const Shape& offset);

// The parts of `box` that none of `cuts` covers, as disjoint boxes (empty when the cuts cover
// it). Each cut splits the remaining boxes into at most 2 * rank pieces; for the handful of
// inputs a compose has this is cheap. Cuts of another rank cover nothing.
std::vector<Box> SubtractBoxes(const Box& box, const std::vector<Box>& cuts);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_BOX_SLICES_H_
