#ifndef SHARDCOORD_WORKER_COMM_NCCL_NCCL_API_H_
#define SHARDCOORD_WORKER_COMM_NCCL_NCCL_API_H_

// The seam between the NCCL communicator's logic and the NCCL/CUDA libraries. Nothing here
// includes nccl.h or cuda_runtime.h, so the lowering of Communicator ops to NCCL calls, the
// watchdog and the abort path build and are unit-tested on machines without CUDA against
// FakeNcclApi; CudaNcclApi (cuda_nccl_api.h) is the real implementation.

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardcoord {
namespace nccl {

// Mirrors ncclResult_t (values checked against nccl.h in cuda_nccl_api.cc).
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// Mirrors the ncclDataType_t values the backend uses.
enum class NcclDataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
};

// Mirrors the ncclRedOp_t values the backend uses.
enum class NcclRedOp : int { kSum = 0, kMax = 2, kMin = 3 };

// "ncclRemoteError", "u8", "sum".
std::string NcclResultName(NcclResult result);
std::string NcclDataTypeName(NcclDataType dtype);
std::string NcclRedOpName(NcclRedOp op);

// Opaque handles: ncclComm_t, cudaStream_t and cudaEvent_t in the real implementation.
struct NcclCommOpaque;
using NcclComm = NcclCommOpaque*;
using GpuStream = void*;
using GpuEvent = void*;

constexpr int kNcclUniqueIdBytes = 128;

// One NCCL call of a lowered Communicator op. Counts are elements of `dtype` (bytes for the
// data-movement ops, which move kUint8).
struct NcclCall {
  enum class Kind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kReduce, kSend, kRecv };

  Kind kind = Kind::kAllReduce;
  const void* send = nullptr;  // kSend: the data; unused by kRecv.
  void* recv = nullptr;        // kRecv: the data; unused by kSend.
  size_t count = 0;
  NcclDataType dtype = NcclDataType::kUint8;
  NcclRedOp op = NcclRedOp::kSum;  // kReduceScatter, kAllReduce, kReduce.
  int peer = -1;                   // Root of kBroadcast / kReduce; peer of kSend / kRecv.
};

// "ncclAllGather", ...
std::string NcclCallName(NcclCall::Kind kind);

// What one Communicator op lowers to: the calls, issued between ncclGroupStart and
// ncclGroupEnd when `grouped`. No calls means nothing to do (every member agrees).
struct NcclLaunch {
  bool grouped = false;
  std::vector<NcclCall> calls;
};

class NcclApi {
 public:
  virtual ~NcclApi() = default;

  // --- NCCL ---
  // ncclGetUniqueId; `id` gets kNcclUniqueIdBytes bytes.
  virtual NcclResult GetUniqueId(std::string* id) = 0;
  // ncclCommInitRankConfig on the current device with config.blocking = 0: it may return
  // kInProgress, and the caller polls CommGetAsyncError until it is not.
  virtual NcclResult CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) = 0;
  virtual NcclResult CommGetAsyncError(NcclComm comm, NcclResult* async_error) = 0;
  virtual NcclResult CommFinalize(NcclComm comm) = 0;
  virtual NcclResult CommDestroy(NcclComm comm) = 0;
  virtual NcclResult CommAbort(NcclComm comm) = 0;
  virtual NcclResult GroupStart() = 0;
  virtual NcclResult GroupEnd() = 0;
  // The one NCCL function `call` names (ncclAllGather, ncclSend, ...) on `stream`.
  virtual NcclResult Issue(const NcclCall& call, NcclComm comm, GpuStream stream) = 0;
  virtual std::string ErrorString(NcclResult result) = 0;
  // ncclGetLastError: NCCL's description of the latest failure ("" when none).
  virtual std::string LastError(NcclComm comm) = 0;

  // --- CUDA runtime: errors are INTERNAL naming the call and the CUDA error ---
  virtual absl::Status SetDevice(int device) = 0;
  virtual absl::Status StreamCreate(GpuStream* stream) = 0;
  virtual absl::Status StreamDestroy(GpuStream stream) = 0;
  virtual absl::Status EventCreate(GpuEvent* event) = 0;
  virtual absl::Status EventDestroy(GpuEvent event) = 0;
  virtual absl::Status EventRecord(GpuEvent event, GpuStream stream) = 0;
  // True once the work recorded before `event` has finished, false while it runs.
  virtual absl::StatusOr<bool> EventQuery(GpuEvent event) = 0;
};

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_NCCL_API_H_
