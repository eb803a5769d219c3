#include "sharding/box.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {

absl::StatusOr<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) {
    return absl::InvalidArgumentError(absl::StrCat(a, " + ", b, " overflows int64"));
  }
  return r;
}

absl::StatusOr<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) {
    return absl::InvalidArgumentError(absl::StrCat(a, " * ", b, " overflows int64"));
  }
  return r;
}

absl::StatusOr<int64_t> CheckedProduct(absl::Span<const int64_t> dims) {
  int64_t p = 1;
  for (int64_t d : dims) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("negative dim ", d));
  }
  // A zero dim makes the product zero even if the others would overflow together.
  if (std::find(dims.begin(), dims.end(), 0) != dims.end()) return 0;
  for (int64_t d : dims) {
    if (__builtin_mul_overflow(p, d, &p)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the product of shape ", ShapeToString(dims), " overflows int64"));
    }
  }
  return p;
}

absl::StatusOr<int64_t> CheckedBytes(absl::Span<const int64_t> shape, int64_t element_size) {
  absl::StatusOr<int64_t> n = CheckedProduct(shape);
  if (!n.ok()) return n.status();
  int64_t bytes;
  if (__builtin_mul_overflow(*n, element_size, &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("the byte size of shape ", ShapeToString(shape),
                                                   " with ", element_size,
                                                   "-byte elements overflows int64"));
  }
  return bytes;
}

absl::Status ValidateShape(absl::Span<const int64_t> shape) {
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeToString(shape), " has negative dim ", i));
    }
  }
  return CheckedProduct(shape).status();
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<Box> Box::Create(Shape offset, Shape shape) {
  if (offset.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("box offset ", ShapeToString(offset),
                                                   " and shape ", ShapeToString(shape),
                                                   " differ in rank"));
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    if (offset[d] < 0 || shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("box offset ", ShapeToString(offset),
                                                     " shape ", ShapeToString(shape),
                                                     " has a negative value in dim ", d));
    }
    if (!CheckedAdd(offset[d], shape[d]).ok()) {
      return absl::InvalidArgumentError(absl::StrCat("box end overflows int64 in dim ", d));
    }
  }
  if (absl::StatusOr<int64_t> v = CheckedProduct(shape); !v.ok()) return v.status();
  return Box(std::move(offset), std::move(shape));
}

int64_t Box::Volume() const {
  // A zero dim first: ValidateShape accepts shapes whose other dims multiply past int64 when
  // one dim is zero (CheckedProduct), and multiplying those first would overflow.
  if (Empty()) return 0;
  int64_t v = 1;
  for (int64_t s : shape_) v *= s;
  return v;
}

bool Box::Empty() const {
  for (int64_t s : shape_) {
    if (s == 0) return true;
  }
  return false;
}

bool Box::Contains(const Box& o) const {
  if (o.ndim() != ndim()) return false;
  if (o.Empty()) return true;
  for (int d = 0; d < ndim(); ++d) {
    if (o.offset_[d] < offset_[d] || o.end(d) > end(d)) return false;
  }
  return true;
}

bool Box::Overlaps(const Box& o) const {
  if (o.ndim() != ndim() || Empty() || o.Empty()) return false;
  for (int d = 0; d < ndim(); ++d) {
    if (std::max(offset_[d], o.offset_[d]) >= std::min(end(d), o.end(d))) return false;
  }
  return true;
}

Box Box::Intersect(const Box& o) const {
  Shape off(ndim()), shp(ndim());
  for (int d = 0; d < ndim(); ++d) {
    const int64_t lo = std::max(offset_[d], o.offset_[d]);
    const int64_t hi = std::min(end(d), o.end(d));
    off[d] = lo;
    shp[d] = hi > lo ? hi - lo : 0;
  }
  return Box(std::move(off), std::move(shp));
}

bool Box::InBounds(absl::Span<const int64_t> shape) const {
  if (shape.size() != shape_.size()) return false;
  for (int d = 0; d < ndim(); ++d) {
    // Written so that unvalidated offsets near INT64_MAX cannot overflow.
    if (offset_[d] < 0 || shape_[d] < 0 || offset_[d] > shape[d] ||
        shape_[d] > shape[d] - offset_[d]) {
      return false;
    }
  }
  return true;
}

std::string Box::ToString() const {
  std::string s = "[";
  for (int d = 0; d < ndim(); ++d) {
    if (d) s += ", ";
    absl::StrAppend(&s, offset_[d], ":", end(d));
  }
  return s + "]";
}

Shape RowMajorStrides(absl::Span<const int64_t> shape) {
  Shape strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    if (__builtin_mul_overflow(strides[d + 1], shape[d + 1], &strides[d])) strides[d] = 0;
  }
  return strides;
}

}  // namespace shardcoord
