#ifndef SHARDCOORD_COORDINATOR_COORDINATOR_H_
#define SHARDCOORD_COORDINATOR_COORDINATOR_H_

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/timer.h"
#include "coordinator/checkpoints/checkpoint_manager.h"
#include "coordinator/cluster/attach_manager.h"
#include "coordinator/cluster/kv_store.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_drain.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/cluster/worker_registration.h"
#include "coordinator/http/dashboard.h"
#include "coordinator/io/tensor_io.h"
#include "coordinator/plans/admission.h"
#include "coordinator/plans/block_copy.h"
#include "coordinator/plans/coordinator_metrics.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/plans/plan_relay.h"
#include "coordinator/plans/slice_copy.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/rpc/caller_quota.h"
#include "coordinator/rpc/coordinator_service.h"
#include "coordinator/rpc/grpc_worker_client.h"
#include "coordinator/rpc/request_log.h"
#include "coordinator/rpc/worker_facing_service.h"
#include "coordinator/state/tensor_bands.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/store/state_store.h"
#include "coordinator/store/state_store_uri.h"
#include "coordinator/transfers/transfer_manager.h"
#include "grpcpp/server.h"
#include "proto/grpc_health.h"

namespace shardcoord {

struct CoordinatorOptions {
  std::string listen = "127.0.0.1:7400";  // Port 0 picks a free port.
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  absl::Duration heartbeat_interval = absl::Milliseconds(500);
  absl::Duration plan_timeout = absl::Minutes(5);
  bool use_collectives = true;
  // Whole uploads and downloads move through the coordinator in bands of at most this many
  // bytes along dim 0 (at least one dim-0 index each); see coordinator/state/tensor_bands.h.
  int64_t io_band_bytes = kDefaultBandBytes;
  // A tensor created or uploaded may not be larger (RESOURCE_EXHAUSTED).
  int64_t max_tensor_bytes = kDefaultMaxTensorBytes;
  // Plans of tensors up to this size (plain copies: no Partial, no in-place target) are
  // relayed through the coordinator instead of running on the workers
  // (coordinator/plans/plan_relay.h); 0: never.
  int64_t relay_max_bytes = kDefaultRelayMaxBytes;
  // The largest gRPC message the coordinator accepts from clients and workers (gRPC answers
  // RESOURCE_EXHAUSTED beyond). Data streams use 1 MiB messages; requests with large layouts
  // (many ranks, flat ranges) and workers' reports need more.
  int max_message_bytes = 64 << 20;
  // Per caller (token name, or host without tokens): open WatchPlan streams, and plans or
  // groups running at once (RESOURCE_EXHAUSTED beyond).
  int64_t max_watches_per_caller = 64;
  int64_t max_plans_per_caller = 256;
  // Where the state (meshes, tensors, worker ranks, request outcomes) lives
  // (coordinator/store/state_store_uri.h, --state): memory (lost when the process ends),
  // sqlite:DIR (DIR/state.db; one coordinator per directory) or etcd://... (several
  // coordinators, one leads: EtcdCoordinator sets `etcd_store` once elected). A durable state
  // is loaded at start and recovered as after a restart (see docs/decisions.md).
  StateStoreUri state;
  // With an etcd:// state: the client, the election that fences every write, the prefix.
  EtcdStoreEnv etcd_store;
  // The elected leader's advertised HOST:PORT: every answer names it in the trailing metadata
  // shardcoord-leader (coordinator/rpc/grpc_leader_hint.h); empty: nothing is added.
  std::string leader_hint;
  // After a restart, how long a recovered tensor waits for the workers that held its
  // chunks to register again; chunks of those still missing then are lost.
  absl::Duration recovery_timeout = absl::Seconds(15);
  // worker_client.tls also serves both services: TLS when enabled (the client
  // authentication of worker_client.tls.client_auth; with kRequire a worker's certificate must
  // name the worker), plaintext otherwise.
  GrpcWorkerClientOptions worker_client;
  // Serve plaintext on a non-loopback --listen address (refused otherwise).
  bool insecure = false;
  // How long a plan waits for memory on the workers (coordinator/plans/admission.h) before it
  // fails with RESOURCE_EXHAUSTED; zero: it fails at once.
  absl::Duration admission_timeout = absl::Seconds(30);
  // Bearer tokens and roles (coordinator/rpc/auth.h); empty: every call is allowed.
  std::optional<Authenticator> auth;
  // HOST:PORT of the HTTP server for Prometheus metrics (GET /metrics); port 0 picks a free
  // one; empty: no HTTP server.
  std::string http_listen = "127.0.0.1:7401";
  // HOST:PORT of a plaintext gRPC server that serves only grpc.health.v1.Health (for
  // Kubernetes gRPC probes, which cannot speak TLS); port 0 picks a free one; empty: none
  // (the health service is always served on `listen` too).
  std::string health_listen;
};

// The composition root, as Ray's GCS server: opens the state store from its URI, owns one
// manager per concern, installs every reaction to a worker's death in one listener
// (InstallEventListeners), serves both gRPC services, and runs the health thread.
class Coordinator {
 public:
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();

  // Binds and starts serving; returns the address it listens on ("127.0.0.1:41234"). Fails
  // when the state store could not be opened or loaded (FAILED_PRECONDITION: in use by
  // another coordinator; INTERNAL: a record does not parse; UNAVAILABLE: I/O).
  absl::StatusOr<std::string> Start();
  // After Start: the HTTP server's bound address, empty when it is off.
  const std::string& http_address() const { return http_address_; }
  // The metrics registry (e.g. for in-process tests).
  const Registry& registry() const { return registry_; }

  // What the state store is ("memory", "sqlite:DIR/state.db", "etcd://HOST:PORT PREFIX").
  std::string state_description() const { return store_->Describe(); }
  // After Start: the address of the --health-listen server, empty when there is none.
  const std::string& health_address() const { return health_address_; }

  // SIGTERM's first half: readiness turns NOT_SERVING, new plans are refused (UNAVAILABLE,
  // clients retry against the replacement), and running plans get up to `timeout` to end.
  // Returns how many still run (Shutdown aborts them). Blocks: call from the main thread.
  int Drain(absl::Duration timeout);
  // Aborts running plans, completes pending waits, stops serving and the health thread.
  // Idempotent.
  void Shutdown();

 private:
  void HealthLoop();
  // The one WorkerListener: a worker's death reaches the plans, prepared transfers, the
  // memory view, uploads and downloads, checkpoints and attached buffers from there (and the
  // log).
  void InstallEventListeners();

  const CoordinatorOptions options_;
  Registry registry_;
  CoordinatorMetrics metrics_;
  absl::Status init_status_;  // Why the store could not be opened or loaded.
  std::unique_ptr<StateStore> store_;
  RealClock clock_;
  ThreadTimer timer_;
  WorkerManager workers_;
  MeshManager meshes_;
  TensorManager tensors_;
  RequestLog requests_;  // Outcomes of mutating requests, for idempotent retries.
  CallerQuota watches_;
  CallerQuota running_plans_;
  WorkerRegistration registration_;  // A worker joining: register, reconcile, roll back.
  KvStore kv_;
  std::unique_ptr<GrpcWorkerClient> client_;
  // Memory admission: outlives the plan manager and tensor I/O, which hold it.
  std::unique_ptr<ClusterMemoryView> memory_view_;
  std::unique_ptr<AdmissionController> admission_;
  std::unique_ptr<PlanManager> plans_;
  std::unique_ptr<WorkerDrain> drain_;  // Workers leaving (LeaveWorker).
  std::unique_ptr<TensorIo> io_;
  std::unique_ptr<CheckpointManager> checkpoints_;
  std::unique_ptr<TransferManager> transfers_;  // Prepared transfers (issue 27).
  std::unique_ptr<BlockCopy> block_copy_;       // Block-scaled FP8 copies (issue 28).
  std::unique_ptr<SliceCopier> slices_;         // Copies with slices (issue 28 item 4).
  std::unique_ptr<Dashboard> dashboard_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<AttachManager> attach_;  // Buffers lent by user processes.
  std::unique_ptr<WorkerFacingService> worker_service_;
  std::unique_ptr<WorkerListener> worker_events_;
  std::unique_ptr<grpc::Server> server_;
  HttpServer http_;
  std::string http_address_;
  HealthStatus grpc_health_;  // grpc.health.v1.Health: ready once started, not while draining.
  std::string health_address_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::thread health_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_COORDINATOR_H_
