#include "worker/comm/nccl/cuda_nccl_api.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "worker/comm/nccl/cuda_status.h"

namespace shardcoord {
namespace nccl {
namespace {

static_assert(static_cast<int>(NcclResult::kSuccess) == ncclSuccess);
static_assert(static_cast<int>(NcclResult::kUnhandledCudaError) == ncclUnhandledCudaError);
static_assert(static_cast<int>(NcclResult::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(NcclResult::kInternalError) == ncclInternalError);
static_assert(static_cast<int>(NcclResult::kInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(NcclResult::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);
static_assert(static_cast<int>(NcclDataType::kInt8) == ncclInt8);
static_assert(static_cast<int>(NcclDataType::kUint8) == ncclUint8);
static_assert(static_cast<int>(NcclDataType::kInt32) == ncclInt32);
static_assert(static_cast<int>(NcclDataType::kInt64) == ncclInt64);
static_assert(static_cast<int>(NcclDataType::kUint32) == ncclUint32);
static_assert(static_cast<int>(NcclDataType::kUint64) == ncclUint64);
static_assert(static_cast<int>(NcclDataType::kFloat16) == ncclFloat16);
static_assert(static_cast<int>(NcclDataType::kFloat32) == ncclFloat32);
static_assert(static_cast<int>(NcclDataType::kFloat64) == ncclFloat64);
static_assert(static_cast<int>(NcclDataType::kBfloat16) == ncclBfloat16);
static_assert(static_cast<int>(NcclRedOp::kSum) == ncclSum);
static_assert(static_cast<int>(NcclRedOp::kMax) == ncclMax);
static_assert(static_cast<int>(NcclRedOp::kMin) == ncclMin);
static_assert(sizeof(ncclUniqueId) == kNcclUniqueIdBytes);

NcclResult R(ncclResult_t r) { return static_cast<NcclResult>(r); }
ncclComm_t C(NcclComm c) { return reinterpret_cast<ncclComm_t>(c); }
cudaStream_t S(GpuStream s) { return static_cast<cudaStream_t>(s); }
cudaEvent_t E(GpuEvent e) { return static_cast<cudaEvent_t>(e); }
ncclDataType_t D(NcclDataType d) { return static_cast<ncclDataType_t>(d); }
ncclRedOp_t O(NcclRedOp o) { return static_cast<ncclRedOp_t>(o); }

}  // namespace

NcclResult CudaNcclApi::GetUniqueId(std::string* id) {
  ncclUniqueId uid;
  const ncclResult_t r = ncclGetUniqueId(&uid);
  if (r == ncclSuccess) id->assign(uid.internal, sizeof(uid.internal));
  return R(r);
}

NcclResult CudaNcclApi::CommInitRank(NcclComm* comm, int nranks, const std::string& id, int rank) {
  if (id.size() != sizeof(ncclUniqueId)) return NcclResult::kInvalidArgument;
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), sizeof(uid.internal));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c = nullptr;
  const ncclResult_t r = ncclCommInitRankConfig(&c, nranks, uid, rank, &config);
  *comm = reinterpret_cast<NcclComm>(c);
  return R(r);
}

NcclResult CudaNcclApi::CommGetAsyncError(NcclComm comm, NcclResult* async_error) {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(C(comm), &state);
  *async_error = R(state);
  return R(r);
}

NcclResult CudaNcclApi::CommFinalize(NcclComm comm) { return R(ncclCommFinalize(C(comm))); }
NcclResult CudaNcclApi::CommDestroy(NcclComm comm) { return R(ncclCommDestroy(C(comm))); }
NcclResult CudaNcclApi::CommAbort(NcclComm comm) { return R(ncclCommAbort(C(comm))); }
NcclResult CudaNcclApi::GroupStart() { return R(ncclGroupStart()); }
NcclResult CudaNcclApi::GroupEnd() { return R(ncclGroupEnd()); }

NcclResult CudaNcclApi::Issue(const NcclCall& call, NcclComm comm, GpuStream stream) {
  using Kind = NcclCall::Kind;
  switch (call.kind) {
    case Kind::kAllGather:
      return R(ncclAllGather(call.send, call.recv, call.count, D(call.dtype), C(comm), S(stream)));
    case Kind::kReduceScatter:
      return R(ncclReduceScatter(call.send, call.recv, call.count, D(call.dtype), O(call.op),
                                 C(comm), S(stream)));
    case Kind::kAllReduce:
      return R(ncclAllReduce(call.send, call.recv, call.count, D(call.dtype), O(call.op), C(comm),
                             S(stream)));
    case Kind::kBroadcast:
      return R(ncclBroadcast(call.send, call.recv, call.count, D(call.dtype), call.peer, C(comm),
                             S(stream)));
    case Kind::kReduce:
      return R(ncclReduce(call.send, call.recv, call.count, D(call.dtype), O(call.op), call.peer,
                          C(comm), S(stream)));
    case Kind::kSend:
      return R(ncclSend(call.send, call.count, D(call.dtype), call.peer, C(comm), S(stream)));
    case Kind::kRecv:
      return R(ncclRecv(call.recv, call.count, D(call.dtype), call.peer, C(comm), S(stream)));
  }
  return NcclResult::kInvalidArgument;
}

std::string CudaNcclApi::ErrorString(NcclResult result) {
  return ncclGetErrorString(static_cast<ncclResult_t>(result));
}

std::string CudaNcclApi::LastError(NcclComm comm) {
  const char* s = ncclGetLastError(C(comm));
  return s == nullptr ? "" : s;
}

absl::Status CudaNcclApi::SetDevice(int device) {
  return CudaStatus(cudaSetDevice(device), "cudaSetDevice");
}

absl::Status CudaNcclApi::StreamCreate(GpuStream* stream) {
  cudaStream_t s = nullptr;
  // Non-blocking: no implicit synchronization with the legacy default stream, which other
  // libraries in the process may use.
  absl::Status st =
      CudaStatus(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  *stream = s;
  return st;
}

absl::Status CudaNcclApi::StreamDestroy(GpuStream stream) {
  return CudaStatus(cudaStreamDestroy(S(stream)), "cudaStreamDestroy");
}

absl::Status CudaNcclApi::EventCreate(GpuEvent* event) {
  cudaEvent_t e = nullptr;
  absl::Status st =
      CudaStatus(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
  *event = e;
  return st;
}

absl::Status CudaNcclApi::EventDestroy(GpuEvent event) {
  return CudaStatus(cudaEventDestroy(E(event)), "cudaEventDestroy");
}

absl::Status CudaNcclApi::EventRecord(GpuEvent event, GpuStream stream) {
  return CudaStatus(cudaEventRecord(E(event), S(stream)), "cudaEventRecord");
}

absl::StatusOr<bool> CudaNcclApi::EventQuery(GpuEvent event) {
  const cudaError_t err = cudaEventQuery(E(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) return false;
  return CudaStatus(err, "cudaEventQuery");
}

std::string NcclVersionString() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return absl::StrCat(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

}  // namespace nccl
}  // namespace shardcoord
