#ifndef SHARDCOORD_PROTO_GRPC_STATUS_H_
#define SHARDCOORD_PROTO_GRPC_STATUS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace shardcoord {

// The longest status message ToGrpcStatus sends. gRPC sends it as the grpc-message trailer,
// percent-encoded (up to 3 bytes a byte), and a client refuses metadata over its limit (8 KiB
// by default) with RESOURCE_EXHAUSTED "received initial metadata size exceeds limit": the
// caller loses the real status, and the calls that follow on the same connection may fail
// too (tests/rpc_fuzz_test found both, from messages that quote a 70000-byte name).
inline constexpr size_t kMaxGrpcStatusMessageBytes = 2048;

// grpc::StatusCode and absl::StatusCode share their numbering (both are the canonical
// codes); a gRPC code outside it becomes UNKNOWN, as gRPC itself treats it. Messages are
// kept as they are, except that ToGrpcStatus cuts one longer than
// kMaxGrpcStatusMessageBytes (on a UTF-8 character boundary) and says so at its end.
absl::Status FromGrpcStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_GRPC_STATUS_H_
