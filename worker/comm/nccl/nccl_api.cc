#include "worker/comm/nccl/nccl_api.h"

#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace nccl {

std::string NcclResultName(NcclResult result) {
  switch (result) {
    case NcclResult::kSuccess:
      return "ncclSuccess";
    case NcclResult::kUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case NcclResult::kSystemError:
      return "ncclSystemError";
    case NcclResult::kInternalError:
      return "ncclInternalError";
    case NcclResult::kInvalidArgument:
      return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage:
      return "ncclInvalidUsage";
    case NcclResult::kRemoteError:
      return "ncclRemoteError";
    case NcclResult::kInProgress:
      return "ncclInProgress";
  }
  return absl::StrCat("ncclResult(", static_cast<int>(result), ")");
}

std::string NcclDataTypeName(NcclDataType dtype) {
  switch (dtype) {
    case NcclDataType::kInt8:
      return "i8";
    case NcclDataType::kUint8:
      return "u8";
    case NcclDataType::kInt32:
      return "i32";
    case NcclDataType::kInt64:
      return "i64";
    case NcclDataType::kUint32:
      return "u32";
    case NcclDataType::kUint64:
      return "u64";
    case NcclDataType::kFloat16:
      return "f16";
    case NcclDataType::kFloat32:
      return "f32";
    case NcclDataType::kFloat64:
      return "f64";
    case NcclDataType::kBfloat16:
      return "bf16";
  }
  return absl::StrCat("ncclDataType(", static_cast<int>(dtype), ")");
}

std::string NcclRedOpName(NcclRedOp op) {
  switch (op) {
    case NcclRedOp::kSum:
      return "sum";
    case NcclRedOp::kMax:
      return "max";
    case NcclRedOp::kMin:
      return "min";
  }
  return absl::StrCat("ncclRedOp(", static_cast<int>(op), ")");
}

std::string NcclCallName(NcclCall::Kind kind) {
  switch (kind) {
    case NcclCall::Kind::kAllGather:
      return "ncclAllGather";
    case NcclCall::Kind::kReduceScatter:
      return "ncclReduceScatter";
    case NcclCall::Kind::kAllReduce:
      return "ncclAllReduce";
    case NcclCall::Kind::kBroadcast:
      return "ncclBroadcast";
    case NcclCall::Kind::kReduce:
      return "ncclReduce";
    case NcclCall::Kind::kSend:
      return "ncclSend";
    case NcclCall::Kind::kRecv:
      return "ncclRecv";
  }
  return "ncclUnknown";
}

}  // namespace nccl
}  // namespace shardcoord
