#ifndef SHARDCOORD_WORKER_BACKENDS_NCCL_KERNELS_H_
#define SHARDCOORD_WORKER_BACKENDS_NCCL_KERNELS_H_

// Launchers for the CUDA kernels in kernels.cu. Plain C++ with the CUDA runtime's types
// (compiled by both nvcc and gcc); device_ops.h wraps them with argument checks and statuses.
// Every launch is asynchronous on `stream`; pointers are device memory.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/backends/nccl/box_geometry.h"

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

// The chunk checksum of worker/checksum.h over `bytes` at `data`: one thread per 1 MiB block
// writes block_hashes[i] (ChecksumBlockCount(bytes) words), then one thread hashes them into
// *result. Both outputs are device memory.
cudaError_t LaunchChunkChecksum(const void* data, int64_t bytes, uint64_t* block_hashes,
                                uint64_t* result, cudaStream_t stream);

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_BACKENDS_NCCL_KERNELS_H_
