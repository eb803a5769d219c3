#ifndef SHARDCOORD_WORKER_COMM_NCCL_CUDA_STATUS_H_
#define SHARDCOORD_WORKER_COMM_NCCL_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace shardcoord {
namespace nccl {

// The one check of a CUDA runtime call's result, used at every call site: OK for
// cudaSuccess; else RESOURCE_EXHAUSTED for out-of-memory, FAILED_PRECONDITION for a missing
// or unusable device or driver, INTERNAL otherwise, with the message
// "<what>: <cudaGetErrorName>: <cudaGetErrorString>". `what` names the call or the operation.
absl::Status CudaStatus(cudaError_t err, absl::string_view what);

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_CUDA_STATUS_H_
