#ifndef SHARDCOORD_COORDINATOR_RPC_GRPC_LEADER_HINT_H_
#define SHARDCOORD_COORDINATOR_RPC_GRPC_LEADER_HINT_H_

// A leading coordinator on etcd names itself in the trailing metadata `shardcoord-leader` of
// every answer, as a standby names the leader. A client told UNAVAILABLE by the coordinator it
// called, naming that same coordinator (a tensor recovering, etcd away for a moment), stays
// with it and backs off instead of moving to a standby (common/coordinator_addresses.h).

#include <memory>
#include <string>

#include "grpcpp/support/server_interceptor.h"

namespace shardcoord {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeLeaderHintInterceptor(
    std::string address);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_GRPC_LEADER_HINT_H_
