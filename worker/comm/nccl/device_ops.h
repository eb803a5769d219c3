#ifndef SHARDCOORD_WORKER_COMM_NCCL_DEVICE_OPS_H_
#define SHARDCOORD_WORKER_COMM_NCCL_DEVICE_OPS_H_

// sharding/box_copy.h's box copies and reductions, and worker/buffers/checksum.h's chunk checksum,
// on device memory. Same arguments, checks and results as the host versions (the index
// math and element math are shared with host-tested code: box_geometry.h, reduce_ops.h,
// xxh64.h). Copies and reductions are enqueued on `stream` and return before they run.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/block_quant.h"
#include "sharding/box.h"
#include "sharding/dtype.h"
#include "sharding/placement.h"
#include "worker/buffers/checksum.h"

namespace shardcoord {
namespace nccl {

absl::Status DeviceCopyBox(const Box& region, const void* src, const Box& src_box, void* dst,
                           const Box& dst_box, int64_t element_size, cudaStream_t stream);
absl::Status DevicePackBox(const Box& region, const void* chunk, const Box& chunk_box, void* packed,
                           int64_t element_size, cudaStream_t stream);
absl::Status DeviceUnpackBox(const Box& region, const void* packed, void* chunk,
                             const Box& chunk_box, int64_t element_size, cudaStream_t stream);
// kSum, kMin, kMax on f32, f64, f16, bf16, i8, u8, i32, i64, bitwise equal to ReduceIntoBox.
absl::Status DeviceReduceIntoBox(const Box& region, const void* src, const Box& src_box, void* dst,
                                 const Box& dst_box, DType dtype, ReduceOp op, cudaStream_t stream);

// sharding/cast.h's CastBox on device memory, bitwise equal (the element conversion is
// sharding/cast_bits.h's, which the host runs too). Equal dtypes are DeviceCopyBox; errors as
// CastBox's (CheckCast's INVALID_ARGUMENT for a cast that is not allowed).
absl::Status DeviceCastBox(const Box& region, const void* src, const Box& src_box, DType src_dtype,
                           void* dst, const Box& dst_box, DType dst_dtype, cudaStream_t stream);

// sharding/block_quant.h's QuantizeBlocks and DequantizeBlocks on device memory (`scales`
// too), bitwise equal to them; same arguments and errors.
absl::Status DeviceQuantizeBlocks(const void* src, DType src_dtype, const Shape& shape,
                                  const BlockSize& block, void* dst, float* scales,
                                  cudaStream_t stream);
absl::Status DeviceDequantizeBlocks(const void* src, const float* scales, const Shape& shape,
                                    const BlockSize& block, void* dst, DType dst_dtype,
                                    cudaStream_t stream);

// ChunkChecksum of `bytes` of device memory at `data` (on the calling thread's current
// device), computed on the device; waits for `stream`, so work already on it that writes
// `data` finishes first.
absl::StatusOr<uint64_t> DeviceChunkChecksum(const void* data, int64_t bytes, cudaStream_t stream);
// The same for many chunks in one launch and one wait (a plan's chunks: their blocks' hash
// chains run side by side). One result per region, in order.
absl::StatusOr<std::vector<uint64_t>> DeviceChunkChecksums(absl::Span<const ChecksumRegion> regions,
                                                           cudaStream_t stream);

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_DEVICE_OPS_H_
