#ifndef SHARDCOORD_PROTO_GRPC_STATUS_H_
#define SHARDCOORD_PROTO_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace shardcoord {

// grpc::StatusCode and absl::StatusCode share their numbering (both are the canonical
// codes); a gRPC code outside it becomes UNKNOWN, as gRPC itself treats it. Messages are
// kept as they are.
absl::Status FromGrpcStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_GRPC_STATUS_H_
