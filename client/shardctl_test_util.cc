#include "client/shardctl_test_util.h"

#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/shardctl_app.h"

namespace shardcoord {

std::unique_ptr<grpc::Server> ServeOnLoopback(grpc::Service* service, std::string* address) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return nullptr;
  if (port == 0) {
    server->Shutdown();
    return nullptr;
  }
  *address = absl::StrCat("127.0.0.1:", port);
  return server;
}

int RunShardctlMain(std::vector<std::string> args, const std::string& stdin,
                    std::ostringstream* out, std::ostringstream* err) {
  args.insert(args.begin(), "shardctl");
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  out->str("");
  err->str("");
  std::streambuf* old_out = std::cout.rdbuf(out->rdbuf());
  std::streambuf* old_err = std::cerr.rdbuf(err->rdbuf());
  std::istringstream in_stream(stdin);
  std::streambuf* old_in = std::cin.rdbuf(in_stream.rdbuf());
  const int rc = ShardctlMain(static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  std::cin.rdbuf(old_in);
  std::cin.clear();
  return rc;
}

}  // namespace shardcoord
