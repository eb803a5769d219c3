#ifndef SHARDCOORD_WORKER_COMM_NCCL_KERNELS_H_
#define SHARDCOORD_WORKER_COMM_NCCL_KERNELS_H_

// Launchers for the CUDA kernels in kernels.cu. Plain C++ with the CUDA runtime's types
// (compiled by both nvcc and gcc); device_ops.h wraps them with argument checks and statuses.
// Every launch is asynchronous on `stream`; pointers are device memory.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/comm/nccl/block_quant_geometry.h"
#include "worker/comm/nccl/box_geometry.h"

namespace shardcoord {
namespace nccl {

// Copies the region `g` describes from `src` to `dst` (a cudaMemcpyAsync for one run,
// cudaMemcpy2DAsync for one strided dim, else a kernel moving the widest aligned units).
cudaError_t LaunchCopyBox(const BoxCopyGeometry& g, const void* src, void* dst,
                          cudaStream_t stream);

// dst = dst (op) src over the region `g` describes; `dtype` and `op` are DeviceDType and
// DeviceReduceOp values (reduce_ops.h).
cudaError_t LaunchReduceBox(const BoxCopyGeometry& g, int dtype, int op, const void* src, void* dst,
                            cudaStream_t stream);

// Converts the region `g` describes from dtype `from` at `src` to dtype `to` at `dst` (DType
// values; a cast sharding/cast.h allows), each element by sharding/cast_bits.h's CastElement.
// `g` is built with element_size 1: its offsets, strides and runs count elements, which each
// side scales by its own element size.
cudaError_t LaunchCastBox(const BoxCopyGeometry& g, int from, int to, const void* src, void* dst,
                          cudaStream_t stream);

// QuantizeBlocks on the device: `src` holds float dtype `from`, `dst` gets the f8_e4m3 bytes and
// `scales` the f32 scales in block order. One thread block per scale block: the amax of its
// finite elements, then its elements quantized, with cast_bits.h's per-element steps.
cudaError_t LaunchQuantizeBlocks(const BlockQuantGeometry& g, int from, const void* src, void* dst,
                                 float* scales, cudaStream_t stream);

// DequantizeBlocks on the device: one thread per element of `dst` (float dtype `to`).
cudaError_t LaunchDequantizeBlocks(const BlockQuantGeometry& g, const void* src,
                                   const float* scales, int to, void* dst, cudaStream_t stream);

// One chunk of a batched checksum: `bytes` at `data`, whose 1 MiB blocks are blocks
// [first_block, first_block + ChecksumBlockCount(bytes)) of the batch.
struct HashRegion {
  const unsigned char* data;
  int64_t bytes;
  int64_t first_block;
};

// The chunk checksums of worker/buffers/checksum.h of `count` regions (a device array, first_block
// ascending, `blocks` blocks in all): one thread per 1 MiB block of any region writes
// block_hashes[b], then one thread per region hashes its blocks' words into results[r]. One
// launch for a plan's chunks, so their blocks' serial XXH64 chains run side by side.
cudaError_t LaunchChunkChecksums(const HashRegion* regions, int64_t count, int64_t blocks,
                                 uint64_t* block_hashes, uint64_t* results, cudaStream_t stream);

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_KERNELS_H_
