#ifndef SHARDCOORD_WORKER_COMM_NCCL_BOX_GEOMETRY_BUILDER_H_
#define SHARDCOORD_WORKER_COMM_NCCL_BOX_GEOMETRY_BUILDER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/block_quant.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "worker/comm/nccl/block_quant_geometry.h"
#include "worker/comm/nccl/box_geometry.h"

namespace shardcoord {
namespace nccl {

// The geometry of copying `region` from a buffer for `src_box` to a buffer for `dst_box`
// (row-major, contiguous; boxes in global coordinates), with the same argument checks and
// INVALID_ARGUMENT messages as sharding/box_copy.h's CopyBox: equal ranks, non-negative
// extents, `region` inside both boxes unless it is empty. Trailing dims spanned fully by
// both boxes merge into one run, dims of extent 1 drop out, and adjacent outer dims merge
// where their strides line up in both buffers; more than kMaxCopyDims outer dims left is
// INVALID_ARGUMENT.
absl::StatusOr<BoxCopyGeometry> MakeBoxCopyGeometry(const Box& region, const Box& src_box,
                                                    const Box& dst_box, int64_t element_size);

// PackBox / UnpackBox shapes: chunk -> dense buffer for `region`, and back.
absl::StatusOr<BoxCopyGeometry> MakePackGeometry(const Box& region, const Box& chunk_box,
                                                 int64_t element_size);
absl::StatusOr<BoxCopyGeometry> MakeUnpackGeometry(const Box& region, const Box& chunk_box,
                                                   int64_t element_size);

// The geometry of block quantizing a buffer of `shape` holding (or receiving) `dtype`, with
// QuantizeBlocks' checks: INVALID_ARGUMENT naming `what` ("src", "dst") and the dtype unless it
// is a float dtype other than f8_e8m0; fewer than two dims or a block under 1x1.
absl::StatusOr<BlockQuantGeometry> MakeBlockQuantGeometry(DType dtype, const Shape& shape,
                                                          const BlockSize& block,
                                                          absl::string_view what);

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_BOX_GEOMETRY_BUILDER_H_
