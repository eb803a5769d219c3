#ifndef SHARDCOORD_SHARDING_BOX_COPY_H_
#define SHARDCOORD_SHARDING_BOX_COPY_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/float16.h"
#include "sharding/placement.h"

namespace shardcoord {

// Strided copies between n-d boxes on host memory. A buffer "for box B" holds the elements
// of B row-major and contiguously; boxes are in global tensor coordinates.
//
// Every function checks that the boxes have the same rank, non-negative shapes, and that
// `region` lies inside both buffers' boxes (INVALID_ARGUMENT naming the boxes otherwise).
// An empty region copies nothing and may take null pointers. Source and destination memory
// must not overlap.

// How a copy of `region` between two row-major chunk buffers (of `src_box`, `dst_box`) walks
// memory: `run_bytes`-long contiguous runs (trailing dims spanned fully by both boxes merge
// into one run), one per point of the outer dims (outermost first, dims of extent 1
// dropped), at byte offsets advanced by the strides. CopyBox and the device kernels
// (worker/backends/nccl) share it, so host and GPU agree on the geometry and its checks.
struct BoxCopyRuns {
  bool empty = false;
  int64_t run_elems = 0;
  int64_t run_bytes = 0;
  int64_t src_start = 0;
  int64_t dst_start = 0;
  std::vector<int64_t> count;
  std::vector<int64_t> src_stride;
  std::vector<int64_t> dst_stride;
};

// INVALID_ARGUMENT as CopyBox: ranks differ, negative extents, an element size <= 0, byte
// sizes that overflow, or a non-empty region outside either box.
absl::StatusOr<BoxCopyRuns> PlanBoxCopy(const Box& region, const Box& src_box, const Box& dst_box,
                                        int64_t element_size);

// Copies the elements of `region` from `src` (a buffer for `src_box`) to `dst` (a buffer for
// `dst_box`). Trailing dims that `region` spans fully in both boxes merge into one
// contiguous run, so a row-major-contiguous region is a single memcpy.
absl::Status CopyBox(const Box& region, const void* src, const Box& src_box, void* dst,
                     const Box& dst_box, int64_t element_size);

// `region` of a chunk (a buffer for `chunk_box`) into a dense buffer for `region`.
absl::Status PackBox(const Box& region, const void* chunk, const Box& chunk_box, void* packed,
                     int64_t element_size);

// A dense buffer for `region` into `region` of a chunk (a buffer for `chunk_box`).
absl::Status UnpackBox(const Box& region, const void* packed, void* chunk, const Box& chunk_box,
                       int64_t element_size);

// As CopyBox, but combines: dst = op(dst, src) element-wise. Supports the dtypes that may be
// Partial (dtype.h's PartialAllowed): f32, f64, f16, bf16 (computed in float, rounded back to
// nearest even), i8, u8, i32, u32, i64, u64 (sum wraps around as in two's complement) with
// kSum, kMin, kMax; float min/max propagate NaN. Other dtypes: INVALID_ARGUMENT. kAvg is rejected:
// callers reduce with kSum and then DivideBox by the number of contributions.
absl::Status ReduceIntoBox(const Box& region, const void* src, const Box& src_box, void* dst,
                           const Box& dst_box, DType dtype, ReduceOp op);

// The contiguous byte runs `region` covers in a row-major buffer for `box`, in row-major
// order: the pieces PackBox gathers, as offsets from the buffer's start and their common
// length (one run when the region is contiguous there; none when it is empty). Lets a
// transport move a strided region without packing it. INVALID_ARGUMENT as PackBox.
struct RegionRuns {
  int64_t run_bytes = 0;
  std::vector<int64_t> offsets;
};
absl::StatusOr<RegionRuns> RegionByteRuns(const Box& region, const Box& box, int64_t element_size);

// `box` cut along its outermost dim of extent > 1 into consecutive slabs of at most
// `max_bytes` each, in row-major order; `box` itself when it fits or has no such dim. When
// one index of that dim alone exceeds `max_bytes`, each index is cut the same way along the
// next dims, so no slab exceeds `max_bytes` unless one element does (staging bounded by the
// slab size stays bounded for any shape).
// Both ends of a transfer split it alike, so its pieces can be packed, sent, landed and
// checked one after another. A slab of a box that is contiguous in a chunk is contiguous
// there too. Requires element_size > 0 and max_bytes > 0.
std::vector<Box> SplitIntoSlabs(const Box& box, int64_t element_size, int64_t max_bytes);

// data[i] /= divisor for `count` contiguous elements (integers truncate toward zero, as C++
// and torch's trunc division do). `divisor` must be positive; the dtype one that may be
// Partial (INVALID_ARGUMENT otherwise).
absl::Status DivideBox(void* data, int64_t count, DType dtype, int64_t divisor);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_BOX_COPY_H_
