#ifndef SHARDCOORD_PROTO_RPC_METRICS_H_
#define SHARDCOORD_PROTO_RPC_METRICS_H_

#include <memory>
#include <string>

#include "common/metrics.h"
#include "grpcpp/support/client_interceptor.h"
#include "grpcpp/support/server_interceptor.h"

namespace shardcoord {

// A gRPC server interceptor factory that counts every call by method and status code and
// observes its latency (start to status) by method, as the families passed in (labels
// {"method", "code"} and {"method"}). The method label is the full name without the leading
// slash ("shardcoord.v1.Coordinator/Redistribute"): bounded by the registered services.
// With `message_bytes` (labels {"method", "direction"}; may be null) it also counts the
// serialized bytes of every message the server receives ("received") and sends ("sent").
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptor(
    CounterFamily* calls, HistogramFamily* seconds, CounterFamily* message_bytes = nullptr);

// A client interceptor factory counting, into `message_bytes` as above, the bytes of every
// message a channel's calls send and receive: with the server side's, every byte a daemon
// moves over gRPC, whichever side started the call.
std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
MakeRpcBytesClientInterceptor(CounterFamily* message_bytes);

// "OK", "NOT_FOUND", ... (absl's names, which match gRPC's codes).
std::string RpcCodeName(grpc::StatusCode code);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_RPC_METRICS_H_
