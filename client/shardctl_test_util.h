#ifndef SHARDCOORD_CLIENT_SHARDCTL_TEST_UTIL_H_
#define SHARDCOORD_CLIENT_SHARDCTL_TEST_UTIL_H_

// The whole shardctl command line (ShardctlMain) against a fake coordinator, for the command
// tests.

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"

namespace shardcoord {

// A server of `service` on a free loopback port, its address ("127.0.0.1:<port>") in
// `*address`; null when it did not start or got no port.
std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service, std::string* address);

// Runs ShardctlMain on "shardctl" and `args` with `stdin` as std::cin; what it prints on
// std::cout and std::cerr replaces `*out` and `*err`. Its exit code.
int RunShardctlMain(std::vector<std::string> args, const std::string& stdin,
                    std::ostringstream* out, std::ostringstream* err);

}  // namespace shardcoord

#endif  // SHARDCOORD_CLIENT_SHARDCTL_TEST_UTIL_H_
