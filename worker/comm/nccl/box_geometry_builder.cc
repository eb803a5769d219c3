#include "worker/comm/nccl/box_geometry_builder.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "sharding/box_copy.h"

namespace shardcoord {
namespace nccl {

absl::StatusOr<BoxCopyGeometry> MakeBoxCopyGeometry(const Box& region, const Box& src_box,
                                                    const Box& dst_box, int64_t element_size) {
  absl::StatusOr<BoxCopyRuns> runs = PlanBoxCopy(region, src_box, dst_box, element_size);
  if (!runs.ok()) return runs.status();
  BoxCopyGeometry g;
  g.element_size = element_size;
  if (runs->empty) return g;
  g.run_bytes = runs->run_bytes;
  g.src_start = runs->src_start;
  g.dst_start = runs->dst_start;
  // Outer dims, outermost first; a dim whose stride equals the extent times the stride of
  // the next kept dim in both buffers folds into that dim.
  std::vector<int64_t> count = std::move(runs->count);
  std::vector<int64_t> src_stride = std::move(runs->src_stride);
  std::vector<int64_t> dst_stride = std::move(runs->dst_stride);
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
    return absl::InvalidArgumentError(
        absl::StrCat("region ", region.ToString(), " needs ", count.size(),
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

absl::StatusOr<BlockQuantGeometry> MakeBlockQuantGeometry(DType dtype, const Shape& shape,
                                                          const BlockSize& block,
                                                          absl::string_view what) {
  if (!IsFloat(dtype) || dtype == DType::kF8E8M0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " dtype ", DTypeName(dtype),
                     " cannot be block-quantized (a float dtype other than f8_e8m0 is needed)"));
  }
  if (block.rows < 1 || block.cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("block quantization with block ", BlockQuantizationText(block)));
  }
  absl::StatusOr<Shape> scale_shape = BlockScaleShape(shape, block);
  if (!scale_shape.ok()) return scale_shape.status();
  BlockQuantGeometry g;
  g.outer = 1;
  for (size_t d = 0; d + 2 < shape.size(); ++d) g.outer *= shape[d];
  g.m = shape[shape.size() - 2];
  g.n = shape[shape.size() - 1];
  g.rows = block.rows;
  g.cols = block.cols;
  g.row_blocks = (*scale_shape)[shape.size() - 2];
  g.col_blocks = (*scale_shape)[shape.size() - 1];
  return g;
}

}  // namespace nccl
}  // namespace shardcoord
