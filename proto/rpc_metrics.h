#ifndef SHARDCOORD_PROTO_RPC_METRICS_H_
#define SHARDCOORD_PROTO_RPC_METRICS_H_

#include <memory>
#include <string>

#include "common/metrics.h"
#include "grpcpp/support/server_interceptor.h"

namespace shardcoord {

// A gRPC server interceptor factory that counts every call by method and status code and
// observes its latency (start to status) by method, as the families passed in (labels
// {"method", "code"} and {"method"}). The method label is the full name without the leading
// slash ("shardcoord.v1.Coordinator/Redistribute"): bounded by the registered services.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptor(
    CounterFamily* calls, HistogramFamily* seconds);

// "OK", "NOT_FOUND", ... (absl's names, which match gRPC's codes).
std::string RpcCodeName(grpc::StatusCode code);

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_RPC_METRICS_H_
