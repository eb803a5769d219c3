#ifndef SHARDCOORD_PROTO_GRPC_HEALTH_H_
#define SHARDCOORD_PROTO_GRPC_HEALTH_H_

// grpc.health.v1.Health for the daemons, as Kubernetes gRPC probes call it: gRPC's own
// default health service (libgrpc++), with two service names:
//   ""          readiness: SERVING once the daemon can do its work (the coordinator has loaded
//               its state, a worker is registered), NOT_SERVING before, while a worker is
//               re-registering, and while draining;
//   "liveness"  SERVING from start until the process stops (a coordinator outage or a drain
//               must not make Kubernetes restart a worker that holds tensor data).
// Any other name answers NOT_FOUND. The same statuses are served on the daemon's main port and,
// optionally, on a plaintext port that serves nothing else (kubelet's gRPC probes cannot speak
// TLS).

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server.h"

namespace shardcoord {

inline constexpr char kLivenessService[] = "liveness";

class HealthStatus {
 public:
  // Turns on gRPC's default health service for servers built from now on (process-wide).
  // Call before building the daemon's server.
  static void EnableDefaultService();

  HealthStatus() = default;
  ~HealthStatus();
  HealthStatus(const HealthStatus&) = delete;
  HealthStatus& operator=(const HealthStatus&) = delete;

  // Serves the statuses through `server`'s default health service (not owned; must outlive
  // this object or Shutdown). Sets them at once.
  void Attach(grpc::Server* server);
  // Starts a plaintext server on `listen` (port 0: a free one) that serves only
  // grpc.health.v1.Health; returns its bound "host:port". UNAVAILABLE when it cannot bind.
  absl::StatusOr<std::string> ServeOn(const std::string& listen);

  // Readiness ("").
  void SetReady(bool ready);
  bool ready() const;
  // Everything NOT_SERVING for good, and the extra server stopped. Idempotent.
  void Shutdown();

 private:
  void ApplyLocked(grpc::Server* server) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  bool ready_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::Server*> servers_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::Server> own_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_PROTO_GRPC_HEALTH_H_
