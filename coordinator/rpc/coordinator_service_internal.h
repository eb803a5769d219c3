#ifndef SHARDCOORD_COORDINATOR_RPC_COORDINATOR_SERVICE_INTERNAL_H_
#define SHARDCOORD_COORDINATOR_RPC_COORDINATOR_SERVICE_INTERNAL_H_

// What coordinator_service.cc and coordinator_service_transfers.cc share. Not for other rooms.

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

namespace shardcoord {
namespace internal_coordinator_service {

// A list call's page size: 0 means the default (1,000), at most 10,000; INVALID_ARGUMENT
// "page_size: ..." otherwise.
absl::StatusOr<size_t> PageSize(int32_t requested);
// Finishes the call's default reactor with `s`.
grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* ctx, const absl::Status& s);

}  // namespace internal_coordinator_service
}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_COORDINATOR_SERVICE_INTERNAL_H_
