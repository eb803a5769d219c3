#ifndef SHARDCOORD_COORDINATOR_RPC_STANDBY_SERVICE_H_
#define SHARDCOORD_COORDINATOR_RPC_STANDBY_SERVICE_H_

// What a coordinator that does not lead serves on its port (docs/decisions.md, "HA on
// etcd"): one generic service that ends every call of every method, the Coordinator and
// CoordinatorWorkers services' included, at once with UNAVAILABLE naming the leader, and puts
// the leader's HOST:PORT in the trailing metadata `shardcoord-leader` for clients and workers
// to follow; and grpc.health.v1.Health with readiness NOT_SERVING (a Kubernetes Service then
// sends no traffic to it) and liveness SERVING. It holds no state, so it checks no token:
// the leader's address is all it tells.

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server.h"
#include "proto/grpc_health.h"

namespace shardcoord {

class StandbyService : public grpc::CallbackGenericService {
 public:
  // `leader` returns the leader's HOST:PORT ("" when none is known, or when this coordinator
  // was just elected and loads the state: nobody serves yet); `where` names the election for
  // messages ("etcd://127.0.0.1:2379 /shardcoord/default").
  StandbyService(std::function<std::string()> leader, std::string where);

  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override;

 private:
  const std::function<std::string()> leader_;
  const std::string where_;
};

class StandbyServer {
 public:
  // Serves StandbyService on `listen` with `credentials`, and the health statuses there and,
  // when `health_listen` is not empty, on that plaintext port. UNAVAILABLE when it cannot
  // bind.
  static absl::StatusOr<std::unique_ptr<StandbyServer>> Start(
      const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials,
      const std::string& health_listen, std::function<std::string()> leader, std::string where);
  ~StandbyServer();

  // The bound "host:port" of `listen` and of `health_listen` ("" without).
  const std::string& address() const { return address_; }
  const std::string& health_address() const { return health_address_; }
  // Stops serving and frees both ports (the leader's servers bind them next). Idempotent.
  void Shutdown();

 private:
  StandbyServer() = default;

  std::unique_ptr<StandbyService> service_;
  std::unique_ptr<grpc::Server> server_;
  HealthStatus health_;
  std::string address_;
  std::string health_address_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_STANDBY_SERVICE_H_
