#include "worker/backends/nccl/box_geometry_builder.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace nccl {
namespace {

absl::Status CheckExtents(const Box& box, const char* what) {
  for (int d = 0; d < box.ndim(); ++d) {
    if (box.shape(d) < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " ", box.ToString(), " has a negative extent in dim ", d));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BoxCopyGeometry> MakeBoxCopyGeometry(const Box& region, const Box& src_box,
                                                    const Box& dst_box, int64_t element_size) {
  if (element_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("element size ", element_size, " <= 0"));
  }
  if (region.ndim() != src_box.ndim() || region.ndim() != dst_box.ndim()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region ", region.ToString(), ", source box ", src_box.ToString(),
        " and destination box ", dst_box.ToString(), " differ in rank"));
  }
  if (absl::Status s = CheckExtents(region, "region"); !s.ok()) return s;
  if (absl::Status s = CheckExtents(src_box, "source box"); !s.ok()) return s;
  if (absl::Status s = CheckExtents(dst_box, "destination box"); !s.ok()) return s;
  if (absl::Status s = CheckedBytes(src_box.shape(), element_size).status(); !s.ok()) return s;
  if (absl::Status s = CheckedBytes(dst_box.shape(), element_size).status(); !s.ok()) return s;
  BoxCopyGeometry g;
  g.element_size = element_size;
  if (region.Empty()) return g;
  if (!src_box.Contains(region)) {
    return absl::InvalidArgumentError(absl::StrCat("region ", region.ToString(),
                                                   " is not inside source box ",
                                                   src_box.ToString()));
  }
  if (!dst_box.Contains(region)) {
    return absl::InvalidArgumentError(absl::StrCat("region ", region.ToString(),
                                                   " is not inside destination box ",
                                                   dst_box.ToString()));
  }
  const int nd = region.ndim();
  // As box_copy.cc: dims [inner, nd) are one contiguous run in both buffers.
  int inner = nd - 1;
  while (inner > 0 && region.shape(inner) == src_box.shape(inner) &&
         region.shape(inner) == dst_box.shape(inner)) {
    --inner;
  }
  int64_t run_elems = 1;
  for (int d = inner < 0 ? 0 : inner; d < nd; ++d) run_elems *= region.shape(d);
  g.run_bytes = run_elems * element_size;
  const Shape src_strides = RowMajorStrides(src_box.shape());
  const Shape dst_strides = RowMajorStrides(dst_box.shape());
  for (int d = 0; d < nd; ++d) {
    g.src_start += (region.offset(d) - src_box.offset(d)) * src_strides[d] * element_size;
    g.dst_start += (region.offset(d) - dst_box.offset(d)) * dst_strides[d] * element_size;
  }
  // Outer dims, outermost first; a dim whose stride equals the extent times the stride of
  // the next kept dim in both buffers folds into that dim.
  std::vector<int64_t> count, src_stride, dst_stride;
  for (int d = 0; d < inner; ++d) {
    if (region.shape(d) == 1) continue;
    count.push_back(region.shape(d));
    src_stride.push_back(src_strides[d] * element_size);
    dst_stride.push_back(dst_strides[d] * element_size);
  }
  for (int k = static_cast<int>(count.size()) - 2; k >= 0; --k) {
    if (src_stride[k] == count[k + 1] * src_stride[k + 1] &&
        dst_stride[k] == count[k + 1] * dst_stride[k + 1]) {
      count[k] *= count[k + 1];
      src_stride[k] = src_stride[k + 1];
      dst_stride[k] = dst_stride[k + 1];
      count.erase(count.begin() + k + 1);
      src_stride.erase(src_stride.begin() + k + 1);
      dst_stride.erase(dst_stride.begin() + k + 1);
    }
  }
  // An innermost outer dim that steps by exactly one run in both buffers extends the run.
  if (!count.empty() && src_stride.back() == g.run_bytes && dst_stride.back() == g.run_bytes) {
    g.run_bytes *= count.back();
    count.pop_back();
    src_stride.pop_back();
    dst_stride.pop_back();
  }
  if (count.size() > static_cast<size_t>(kMaxCopyDims)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "region ", region.ToString(), " needs ", count.size(),
        " strided dims on the device; at most ", kMaxCopyDims, " are supported"));
  }
  g.ndims = static_cast<int>(count.size());
  g.runs = 1;
  for (int k = 0; k < g.ndims; ++k) {
    g.count[k] = count[k];
    g.src_stride[k] = src_stride[k];
    g.dst_stride[k] = dst_stride[k];
    g.runs *= count[k];
  }
  return g;
}

absl::StatusOr<BoxCopyGeometry> MakePackGeometry(const Box& region, const Box& chunk_box,
                                                 int64_t element_size) {
  return MakeBoxCopyGeometry(region, chunk_box, region, element_size);
}

absl::StatusOr<BoxCopyGeometry> MakeUnpackGeometry(const Box& region, const Box& chunk_box,
                                                   int64_t element_size) {
  return MakeBoxCopyGeometry(region, region, chunk_box, element_size);
}

}  // namespace nccl
}  // namespace shardcoord
