#include "coordinator/rpc/grpc_leader_hint.h"

#include <utility>

#include "common/coordinator_addresses.h"
#include "grpcpp/grpcpp.h"

namespace shardcoord {
namespace {

namespace gx = grpc::experimental;

class LeaderHint : public gx::Interceptor {
 public:
  explicit LeaderHint(const std::string* address) : address_(address) {}
  void Intercept(gx::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_STATUS)) {
      methods->GetSendTrailingMetadata()->emplace(kLeaderMetadataKey, *address_);
    }
    methods->Proceed();
  }

 private:
  const std::string* const address_;
};

class LeaderHintFactory : public gx::ServerInterceptorFactoryInterface {
 public:
  explicit LeaderHintFactory(std::string address) : address_(std::move(address)) {}
  gx::Interceptor* CreateServerInterceptor(gx::ServerRpcInfo*) override {
    return new LeaderHint(&address_);
  }

 private:
  const std::string address_;
};

}  // namespace

std::unique_ptr<gx::ServerInterceptorFactoryInterface> MakeLeaderHintInterceptor(
    std::string address) {
  return std::make_unique<LeaderHintFactory>(std::move(address));
}

}  // namespace shardcoord
