#ifndef SHARDCOORD_SHARDING_BOX_H_
#define SHARDCOORD_SHARDING_BOX_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace shardcoord {

using Shape = std::vector<int64_t>;

// Overflow-checked arithmetic: an overflowing result is INVALID_ARGUMENT, never UB.
absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b);
absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b);
// Product of the dims; every dim must be >= 0.
absl::StatusOr<int64_t> CheckedProduct(absl::Span<const int64_t> dims);
// Bytes of a dense tensor of `shape` with `element_size`-byte elements.
absl::StatusOr<int64_t> CheckedBytes(absl::Span<const int64_t> shape, int64_t element_size);

// Validates a tensor shape: every dim >= 0 and the element count fits in int64.
absl::Status ValidateShape(absl::Span<const int64_t> shape);

// "[8, 4]"
std::string ShapeToString(absl::Span<const int64_t> shape);

// An n-d box: offset and shape per dim, in elements. A box with a zero dim is empty; empty
// boxes still carry an offset (DTensor reports an empty shard at the end of its extent).
class Box {
 public:
  Box() = default;
  Box(Shape offset, Shape shape) : offset_(std::move(offset)), shape_(std::move(shape)) {}

  // Validates ndim agreement, non-negative values and int64 bounds of offset+shape.
  static absl::StatusOr<Box> Create(Shape offset, Shape shape);
  // The whole tensor: offset 0, `shape`.
  static Box Whole(const Shape& shape) { return Box(Shape(shape.size(), 0), shape); }

  int ndim() const { return static_cast<int>(shape_.size()); }
  const Shape& offset() const { return offset_; }
  const Shape& shape() const { return shape_; }
  int64_t offset(int d) const { return offset_[d]; }
  int64_t shape(int d) const { return shape_[d]; }
  int64_t end(int d) const { return offset_[d] + shape_[d]; }

  // Number of elements. Boxes built through Create or inside a validated tensor shape cannot
  // overflow, so this is unchecked.
  int64_t Volume() const;
  bool Empty() const;

  // True if every element of `other` lies in this box (an empty box is contained in any box
  // of the same rank).
  bool Contains(const Box& other) const;
  // True if the boxes share at least one element.
  bool Overlaps(const Box& other) const;
  // The common part; an empty box (Empty() is true) when they do not overlap.
  Box Intersect(const Box& other) const;
  // True if this box lies inside a tensor of `shape`.
  bool InBounds(absl::Span<const int64_t> shape) const;

  // "[0:4, 2:3]"
  std::string ToString() const;

  friend bool operator==(const Box& a, const Box& b) {
    return a.offset_ == b.offset_ && a.shape_ == b.shape_;
  }
  friend bool operator!=(const Box& a, const Box& b) { return !(a == b); }
  // Lexicographic by offset, then shape: a total order for sorting and maps.
  friend bool operator<(const Box& a, const Box& b) {
    if (a.offset_ != b.offset_) return a.offset_ < b.offset_;
    return a.shape_ < b.shape_;
  }
  template <typename H>
  friend H AbslHashValue(H h, const Box& b) {
    return H::combine(std::move(h), b.offset_, b.shape_);
  }

 private:
  Shape offset_;
  Shape shape_;
};

// Row-major strides (in elements) of a dense tensor of `shape`. A tensor with a zero dim has no
// elements to address; where its other dims multiply past int64 (ValidateShape allows that),
// those strides are 0 instead of overflowing.
Shape RowMajorStrides(absl::Span<const int64_t> shape);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_BOX_H_
