#ifndef SHARDCOORD_WORKER_COMM_NCCL_NCCL_LOWERING_H_
#define SHARDCOORD_WORKER_COMM_NCCL_NCCL_LOWERING_H_

// How each Communicator op becomes NCCL calls (worker/comm/communicator.h's table):
//
//   AllGatherV      equal counts: ncclAllGather; else a group of one ncclBroadcast per rank
//                   into its slice of recv
//   AllToAllV       a group of ncclSend/ncclRecv, one pair per peer (self included)
//   ReduceScatterV  equal counts: ncclReduceScatter; else a group of one ncclReduce per rank
//                   with that rank as root
//   AllReduce       ncclAllReduce
//   Broadcast       ncclBroadcast (in place)
//   SendRecv        a group of every ncclSend and ncclRecv, in the order given
//
// Pieces of zero bytes are left out: every member sees the same sizes, so every member
// leaves out the same calls. Arguments are checked here (INVALID_ARGUMENT naming the value),
// before anything reaches NCCL.

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/dtype.h"
#include "sharding/placement.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl/nccl_api.h"

namespace shardcoord {
namespace nccl {

// INVALID_ARGUMENT for kAvg (the caller sums and divides, as worker/comm/communicator.h says).
absl::StatusOr<NcclDataType> ToNcclDataType(DType dtype);
absl::StatusOr<NcclRedOp> ToNcclRedOp(ReduceOp op);

absl::StatusOr<NcclLaunch> LowerAllGatherV(int rank, int size, const void* send, int64_t send_bytes,
                                           void* recv, absl::Span<const int64_t> recv_bytes);
absl::StatusOr<NcclLaunch> LowerAllToAllV(int rank, int size, const void* send,
                                          absl::Span<const int64_t> send_bytes, void* recv,
                                          absl::Span<const int64_t> recv_bytes);
absl::StatusOr<NcclLaunch> LowerReduceScatterV(int rank, int size, const void* send, void* recv,
                                               absl::Span<const int64_t> recv_elements, DType dtype,
                                               ReduceOp op);
absl::StatusOr<NcclLaunch> LowerAllReduce(const void* send, void* recv, int64_t elements,
                                          DType dtype, ReduceOp op);
absl::StatusOr<NcclLaunch> LowerBroadcast(int rank, int size, void* data, int64_t bytes, int root);
absl::StatusOr<NcclLaunch> LowerSendRecv(int rank, int size, absl::Span<const SendOp> sends,
                                         absl::Span<const RecvOp> recvs);

}  // namespace nccl
}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_COMM_NCCL_NCCL_LOWERING_H_
