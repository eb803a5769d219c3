#ifndef SHARDCOORD_WORKER_WORKER_H_
#define SHARDCOORD_WORKER_WORKER_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/http_server.h"
#include "common/metrics.h"
#include "common/thread_pool.h"
#include "common/tls_options.h"
#include "grpcpp/server.h"
#include "proto/grpc_health.h"
#include "worker/buffers/attach_registry.h"
#include "worker/buffers/buffer_store.h"
#include "worker/buffers/checkpoint_io.h"
#include "worker/comm/communicator.h"
#include "worker/comm/nccl/gpu_probe.h"
#include "worker/control/agent.h"
#include "worker/control/worker_core.h"
#include "worker/control/worker_metrics.h"
#include "worker/memory/memory_budget.h"
#include "worker/memory/memory_space.h"
#include "worker/rpc/grpc_coordinator_client.h"
#include "worker/rpc/local_socket_server.h"
#include "worker/rpc/worker_service.h"

namespace shardcoord {

// The backend a worker runs and the GPU it owns.
struct BackendSelection {
  Backend backend = Backend::kGloo;
  int gpu = -1;  // nccl: the CUDA device of the buffers and communicators.
  // Why this backend: the worker's first log line (see BackendChoice).
  std::string log_line;
};

// Resolves --backend ("gloo", "nccl", "auto") and --device (see ParseDeviceFlag). `log`
// receives the choice's line as soon as it is made, before a device check can fail. Errors
// carry the one line to print before exiting 2: a bad --device, nccl with --device cpu or
// without a visible GPU, a device index past the visible ones, or nccl in a build without
// the CUDA toolkit.
absl::StatusOr<BackendSelection> SelectBackend(absl::string_view backend, absl::string_view device,
                                               const std::function<void(absl::string_view)>& log,
                                               const CudaDeviceProbe& probe = VisibleCudaDevices);

struct WorkerOptions {
  std::string coordinator = "127.0.0.1:7400";
  std::string listen = "127.0.0.1:0";  // The Worker service; port 0 picks a free port.
  std::string host;                    // Reported to the coordinator.
  std::string name;                    // Stable worker name; empty: "<host>:<pid>".
  BackendSelection backend;
  // Where Gloo binds and advertises; empty: the --listen host, or `host` when that is a
  // wildcard.
  std::string gloo_host;
  bool same_host_copy = true;
  absl::Duration step_timeout = absl::Seconds(60);  // When a plan gives none.
  absl::Duration register_timeout = absl::Seconds(60);
  // Bearer token (worker role) for a coordinator started with --auth-tokens; empty: none.
  std::string token;
  // HOST:PORT of the HTTP server for Prometheus metrics (GET /metrics); port 0 picks a free
  // one; empty (the default): no HTTP server.
  std::string http_listen;
  // TLS for the Worker service and the calls to the coordinator (the same certificate);
  // plaintext when not enabled.
  TlsOptions tls;
  // Serve plaintext on a non-loopback --listen address (refused otherwise).
  bool insecure = false;
  // The Unix domain socket where user processes on this host attach buffers ("{name}"
  // stands for the worker's name); empty: none. When `local_socket_default` and its
  // directory cannot be created (not root), $TMPDIR (or /tmp)/shardcoord-<uid>/ is used.
  std::string local_socket = kDefaultLocalSocket;
  bool local_socket_default = true;
  // A group (name or gid) whose processes may attach besides the worker's own uid.
  std::string local_group;
  // Checkpoints (save, load, inspect) may only use paths under this directory; empty:
  // anywhere the worker process may write and read (CheckpointIo).
  std::string checkpoint_root;

  static constexpr const char* kDefaultLocalSocket = "/run/shardcoord/{name}.sock";

  // HOST:PORT of a plaintext gRPC server that serves only grpc.health.v1.Health (Kubernetes
  // gRPC probes cannot speak TLS); port 0 picks a free one; empty: none (the Worker service's
  // port serves it too).
  std::string health_listen;

  // The bytes the worker may hold in its buffers' memory (worker/memory/memory_budget.h): by
  // default 80% of the host's (or its cgroup's) memory, of the GPU's free memory for nccl.
  MemoryBudgetSetting memory_budget;
  // The largest bucket its plans use (sharding/staging.h), reported to the coordinator.
  int64_t bucket_bytes = kDefaultBucketBytes;
};

// The composition root, as Coordinator is for the coordinator: owns the coordinator client,
// the memory space and communicator factory of the selected backend, the buffers, WorkerCore,
// its gRPC service and the agent that keeps the worker registered.
class Worker {
 public:
  explicit Worker(WorkerOptions options);
  ~Worker();

  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Builds the backend, serves the Worker service and registers with the coordinator
  // (retrying until register_timeout). Returns the address it serves on, as registered.
  absl::StatusOr<std::string> Start();
  // Stops heartbeats and serving, cancels running fragments and waits up to `grace` for them;
  // false when one still runs (its thread references this object: the process should exit
  // without destroying it). Idempotent.
  bool Shutdown(absl::Duration grace);
  // SIGTERM's first half: readiness turns NOT_SERVING, the worker tells the coordinator it is
  // leaving (LeaveWorker: plans it takes part in get `timeout` to end, chunks only it holds
  // are copied to a live replica where one can take them, then it is gone) and stops
  // accepting plans; when the coordinator cannot be reached it waits up to `timeout` for its
  // running fragments itself. Call Shutdown afterwards (it cancels what still runs).
  void Drain(absl::Duration timeout);
  // After Start: the address of the --health-listen server, empty when there is none.
  const std::string& health_address() const { return health_address_; }

  const std::string& name() const { return options_.name; }
  // After Start: the HTTP server's bound address, empty when it is off.
  const std::string& http_address() const { return http_address_; }
  // After Start: the local socket's path, empty when there is none.
  std::string local_socket() const {
    return local_server_ != nullptr ? local_server_->path() : std::string();
  }
  // After Start: the memory accounting of the worker's buffers' space.
  const MemoryBudget* memory_budget() const { return budget_.get(); }

 private:
  WorkerIdentity Identity() const;
  // Every buffer held, with its chunks' checksums (for registration; 0 for lent memory,
  // whose bytes its process changes at will).
  std::vector<v1::HeldBuffer> HeldBuffers() const;
  // Serves the local socket (options_.local_socket; its fallback).
  absl::Status StartLocalSocket();

  WorkerOptions options_;
  Registry registry_;
  WorkerMetrics metrics_{&registry_};  // After registry_, which it registers in.
  std::unique_ptr<GrpcCoordinatorClient> client_;
  // nccl: the GPU's memory. Null for gloo (host memory).
  std::unique_ptr<MemorySpace> device_space_;
  // Every buffer of the worker's own lives in `space_`, which counts it against `budget_`
  // (both outlive the buffers, declared below).
  std::unique_ptr<MemoryBudget> budget_;
  std::unique_ptr<BudgetedMemorySpace> space_;
  std::unique_ptr<CommunicatorCache> communicators_;
  BufferStore buffers_;
  ThreadPool pool_{2};
  std::unique_ptr<Agent> agent_;
  std::unique_ptr<WorkerCore> core_;
  std::unique_ptr<CheckpointIo> checkpoints_;
  std::unique_ptr<AttachRegistry> attach_;
  std::unique_ptr<LocalSocketServer> local_server_;
  std::unique_ptr<WorkerServiceImpl> service_;
  std::unique_ptr<grpc::Server> server_;
  HttpServer http_;
  std::string http_address_;
  // grpc.health.v1.Health: ready while registered and not draining.
  HealthStatus grpc_health_;
  std::string health_address_;
  std::atomic<bool> draining_{false};
  bool shut_down_ = false;
  bool stopped_cleanly_ = true;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_WORKER_H_
