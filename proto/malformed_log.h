#ifndef SHARDCOORD_PROTO_MALFORMED_LOG_H_
#define SHARDCOORD_PROTO_MALFORMED_LOG_H_

// What the daemons log about requests they could not parse, rate-limited: anyone who can reach
// a port can send malformed bytes, and must not be able to flood the log with them.

#include "proto/rpc_metrics.h"

namespace shardcoord {

// Routes libprotobuf's own log lines (e.g. "String field ... contains invalid UTF-8" while
// parsing a request) to spdlog at warn, at most 20 a minute, each saying how many were
// suppressed before it. Process-wide; daemons call it once at startup.
void RouteProtobufLogsToSpdlog();

// For MakeRpcMetricsInterceptor: logs each call answered INTERNAL or UNIMPLEMENTED (a
// request gRPC could not parse, or a method nobody serves) with its method and the caller's
// peer, at most 20 a minute.
MalformedCallFn LogMalformedCallsRateLimited();

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_MALFORMED_LOG_H_
