#ifndef SHARDCOORD_COORDINATOR_RPC_GRPC_AUTH_H_
#define SHARDCOORD_COORDINATOR_RPC_GRPC_AUTH_H_

// The gRPC side of coordinator/rpc/auth.h: every handler of the coordinator's services starts
// with AuthorizeCall, before it reads its request or touches any state, and a refused call
// finishes at once. (A server interceptor cannot end a call with a status of its choice
// before the handler runs; see docs/decisions.md.)

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "coordinator/rpc/auth.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"

namespace shardcoord {

// "/shardcoord.v1.Coordinator/ListWorkers" from the service's full name and the RPC's.
std::string FullMethodName(absl::string_view service, absl::string_view rpc);

// OK when `auth` is null (no --auth-tokens) or the call's `authorization: Bearer TOKEN`
// metadata authorises `method`; else UNAUTHENTICATED or PERMISSION_DENIED (auth.h). Logs
// refusals (with the token's name, never the token) at warn and accepted calls at debug.
// With `caller`, sets who called: the token's name, or without `auth` the peer's host.
absl::Status AuthorizeCall(const Authenticator* auth, grpc::CallbackServerContext* ctx,
                           absl::string_view method, std::string* caller = nullptr);

// "127.0.0.1" from gRPC's peer "ipv4:127.0.0.1:5000" ("[::1]" from "ipv6:[::1]:5000").
std::string PeerHost(absl::string_view peer);

// A streaming reactor (grpc::ServerReadReactor<T> or grpc::ServerWriteReactor<T>) that ends
// the call with `status` as soon as it is bound and reads or writes nothing.
template <typename Reactor>
class RefusedStream final : public Reactor {
 public:
  explicit RefusedStream(const absl::Status& status) { this->Finish(ToGrpcStatus(status)); }
  void OnDone() override { delete this; }
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_GRPC_AUTH_H_
