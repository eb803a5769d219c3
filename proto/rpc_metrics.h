#ifndef SHARDCOORD_PROTO_RPC_METRICS_H_
#define SHARDCOORD_PROTO_RPC_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "common/metrics.h"
#include "grpcpp/support/client_interceptor.h"
#include "grpcpp/support/server_interceptor.h"

namespace shardcoord {

// The methods a daemon serves or calls, by how their messages reach an interceptor. gRPC
// hands interceptors an untyped pointer to a received message: a protobuf message for
// services generated from a .proto, a grpc::ByteBuffer for raw ones such as gRPC's default
// health service, and for a method nobody registered the caller may send any name. Only
// methods listed as protobuf are ever read as google::protobuf::MessageLite.
class RpcMethods {
 public:
  // Every method of the protobuf services named ("shardcoord.v1.Worker"), as protobuf's
  // generated pool describes them, and grpc.health.v1.Health's Check and Watch as raw
  // methods (every daemon serves the default health service). A service not in the pool
  // adds nothing, so its messages are never read.
  static RpcMethods Of(const std::vector<std::string>& protobuf_services);

  // "/pkg.Service/Method" (or without the leading slash).
  bool IsProtobuf(absl::string_view method) const;
  bool IsKnown(absl::string_view method) const;

 private:
  absl::flat_hash_set<std::string> protobuf_;  // Without the leading slash.
  absl::flat_hash_set<std::string> raw_;
};

// The metric label of a method: its full name without the leading slash
// ("shardcoord.v1.Coordinator/Redistribute") when `methods` knows it, else "unknown", so the
// names unauthenticated callers make up cannot grow the metrics without bound.
std::string RpcMethodLabel(const RpcMethods& methods, const char* method);

// Called, when set, for every call a server answers INTERNAL or UNIMPLEMENTED: gRPC answers a
// request it cannot parse so (1.51's callback handlers UNIMPLEMENTED, before any handler
// runs), and a method nobody serves. The method's label, the caller's peer, the status.
using MalformedCallFn =
    std::function<void(const std::string& method, const std::string& peer, const grpc::Status&)>;

// A gRPC server interceptor factory that counts every call by method and status code and
// observes its latency (start to status) by method, as the families passed in (labels
// {"method", "code"} and {"method"}). With `message_bytes` (labels {"method", "direction"};
// may be null) it also counts the serialized bytes of every message the server sends
// ("sent") and of every protobuf message it receives ("received"; raw methods' received
// messages are not counted: their type is not known here).
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptor(
    RpcMethods methods, CounterFamily* calls, HistogramFamily* seconds,
    CounterFamily* message_bytes = nullptr, MalformedCallFn on_malformed = nullptr);

// A client interceptor factory counting, into `message_bytes` as above, the bytes of every
// message a channel's calls send and receive: with the server side's, every byte a daemon
// moves over gRPC, whichever side started the call. On a client the type of a received
// message is the stub's, not the method's: `methods` names those the channel calls only
// through protobuf stubs (generated code); a generic stub's calls must not be among them.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
MakeRpcBytesClientInterceptor(RpcMethods methods, CounterFamily* message_bytes);

// "OK", "NOT_FOUND", ... (absl's names, which match gRPC's codes).
std::string RpcCodeName(grpc::StatusCode code);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_RPC_METRICS_H_
