#ifndef SHARDCOORD_COORDINATOR_RPC_SERVICE_TEST_UTIL_H_
#define SHARDCOORD_COORDINATOR_RPC_SERVICE_TEST_UTIL_H_

// Both gRPC services over the coordinator's real managers, wired as the composition root
// wires them but with fake workers (coordinator/testing/fake_worker_client.h), a real clock,
// a thread timer and no state store, for the tests (and rpc_fuzz) that serve them in process.

#include <cstdint>
#include <memory>
#include <string>

#include "common/clock.h"
#include "common/timer.h"
#include "coordinator/cluster/attach_manager.h"
#include "coordinator/cluster/kv_store.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/cluster/worker_registration.h"
#include "coordinator/io/tensor_io.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/rpc/caller_quota.h"
#include "coordinator/rpc/coordinator_service.h"
#include "coordinator/rpc/request_log.h"
#include "coordinator/rpc/worker_facing_service.h"
#include "coordinator/state/tensor_bands.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/store/state_store.h"
#include "coordinator/testing/fake_worker_client.h"
#include "grpcpp/grpcpp.h"
#include "proto/shardcoord.grpc.pb.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// What a worker `name` on host "h" (cpu, gloo, at "<name>:1") asks to register.
v1::RegisterWorkerRequest TestRegisterRequest(const std::string& name);

// The managers and services (not the server: each user builds its own, registers `service_`
// and `worker_service_`, and shuts it down before stopping `timer_`). Workers time out after
// 10 minutes and heartbeat every 250 ms.
class ServiceStack {
 protected:
  // Data messages carry at most `max_message_bytes`, tensors are read in `band_bytes` bands;
  // `per_caller` > 0 logs requests and limits each caller's watch streams and running plans
  // to it (0: neither); `auth` (not owned; null: none) checks every call's token.
  explicit ServiceStack(int64_t max_message_bytes, int64_t band_bytes = kDefaultBandBytes,
                        int64_t per_caller = 0, const Authenticator* auth = nullptr);

  RealClock clock_;
  ThreadTimer timer_;
  WorkerManager workers_;
  MeshManager meshes_;
  TensorManager tensors_;
  KvStore kv_;
  FakeWorkerClient client_;
  PlanManager plans_;
  TensorIo io_;
  MemoryStateStore request_store_;
  RequestLog requests_;
  CallerQuota watches_;
  CallerQuota running_plans_;
  CoordinatorService service_;
  WorkerRegistration registration_;
  AttachManager attach_;
  WorkerFacingService worker_service_;
};

// The stack served in process, for the service tests: a fixture calls Serve once what the
// services use is built (its constructor), and StopServing in its destructor.
class ServedStack : protected ServiceStack {
 protected:
  using ServiceStack::ServiceStack;

  // Serves both services, also on a loopback TCP port when `tcp_port` is given (it gets the
  // port), with `coordinator_` and `workers_stub_` on the in-process channel.
  void Serve(int* tcp_port = nullptr);
  // Shuts the server down, then the timer.
  void StopServing();

  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<v1::CoordinatorWorkers::Stub> workers_stub_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_SERVICE_TEST_UTIL_H_
