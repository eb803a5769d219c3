#include "worker/worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/byte_size.h"
#include "common/tls_options.h"
#include "grpcpp/grpcpp.h"
#include "proto/convert.h"
#include "proto/grpc_credentials.h"
#include "proto/malformed_log.h"
#include "proto/rpc_metrics.h"
#include "proto/shardcoord.grpc.pb.h"
#include "spdlog/spdlog.h"
#include "worker/comm/gloo/gloo_communicator.h"

// NCCL and the GPU buffers only where the CUDA toolkit is installed; elsewhere the probe finds
// no device and the worker runs Gloo.
#ifdef SHARDCOORD_HAVE_CUDA
#include "worker/comm/nccl/cuda_memory_space.h"
#include "worker/comm/nccl/nccl_backend.h"
#endif

namespace shardcoord {
namespace {

// "host:port" -> host ("[::1]:5" -> "::1").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

bool IsWildcard(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "*";
}

std::string JoinHostPort(const std::string& host, int port) {
  if (absl::StrContains(host, ':')) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

void LogInfo(absl::string_view line) { spdlog::info("{}", std::string(line)); }

// The memory space and communicator factory of `backend`: the GPU's memory and NCCL on it,
// or host memory (null space) and Gloo.
struct BackendParts {
  std::unique_ptr<MemorySpace> space;
  std::shared_ptr<CommunicatorFactory> factory;
};

absl::StatusOr<BackendParts> MakeBackend(const BackendSelection& backend,
                                         GrpcCoordinatorClient* client, GlooOptions gloo) {
  BackendParts parts;
  if (backend.backend == Backend::kNccl) {
#ifdef SHARDCOORD_HAVE_CUDA
    absl::StatusOr<std::unique_ptr<nccl::CudaMemorySpace>> space =
        nccl::CudaMemorySpace::Create(backend.gpu);
    if (!space.ok()) return space.status();
    parts.space = *std::move(space);
    nccl::NcclFactoryOptions nccl_options;
    nccl_options.device = backend.gpu;
    // The client outlives every communicator: no ownership.
    parts.factory = nccl::MakeNcclCommunicatorFactory(
        std::shared_ptr<KvClient>(std::shared_ptr<void>(), client), nccl_options);
    return parts;
#else
    return absl::FailedPreconditionError(
        "the nccl backend is not built into this worker (no CUDA toolkit at build time)");
#endif
  }
  absl::StatusOr<std::shared_ptr<GlooCommunicatorFactory>> factory =
      GlooCommunicatorFactory::Create(client, std::move(gloo));
  if (!factory.ok()) return factory.status();
  parts.factory = *std::move(factory);
  return parts;
}

}  // namespace

absl::StatusOr<BackendSelection> SelectBackend(absl::string_view backend, absl::string_view device,
                                               const std::function<void(absl::string_view)>& log,
                                               const CudaDeviceProbe& probe) {
  absl::StatusOr<DeviceFlag> device_flag = ParseDeviceFlag(device);
  if (!device_flag.ok()) return device_flag.status();
  BackendChoice choice;
  if (device_flag->cpu) {
    if (backend == "nccl") {
      return absl::InvalidArgumentError("--device cpu: the nccl backend needs a CUDA device");
    }
    choice.log_line = backend == "auto" ? "backend auto: --device cpu, using gloo"
                                        : "backend gloo: selected by --backend";
  } else {
    absl::StatusOr<BackendChoice> chosen = ChooseBackend(backend, probe);
    if (!chosen.ok()) return chosen.status();  // "no CUDA device visible: ..."
    choice = *std::move(chosen);
  }
  if (log) log(choice.log_line);
  BackendSelection selection;
  selection.backend = choice.backend;
  selection.log_line = std::move(choice.log_line);
  if (choice.backend == Backend::kNccl) {
    absl::StatusOr<int> gpu = ResolveDevice(device_flag->index, choice.visible_devices);
    if (!gpu.ok()) return gpu.status();
    selection.gpu = *gpu;
#ifndef SHARDCOORD_HAVE_CUDA
    // Unreachable with the real probe: without the toolkit it finds no device.
    return absl::FailedPreconditionError(
        "the nccl backend is not built into this worker (no CUDA toolkit at build time)");
#endif
  }
  return selection;
}

Worker::Worker(WorkerOptions options) : options_(std::move(options)) {
  if (options_.name.empty()) options_.name = absl::StrCat(options_.host, ":", getpid());
  options_.local_socket = absl::StrReplaceAll(options_.local_socket, {{"{name}", options_.name}});
  const std::string listen_host = HostOf(options_.listen);
  if (options_.gloo_host.empty()) {
    options_.gloo_host = IsWildcard(listen_host) ? options_.host : listen_host;
  }
}

Worker::~Worker() { Shutdown(absl::Seconds(2)); }

WorkerIdentity Worker::Identity() const {
  return agent_ != nullptr ? agent_->identity() : WorkerIdentity{options_.name, 0, -1};
}

absl::StatusOr<std::string> Worker::Start() {
  const bool nccl = options_.backend.backend == Backend::kNccl;
  const std::string device_name = nccl ? absl::StrCat("cuda:", options_.backend.gpu) : "cpu";
  if (absl::Status s = CheckPlaintextListen("listen", options_.listen, options_.tls.enabled(),
                                            options_.insecure);
      !s.ok()) {
    return s;
  }
  if (!options_.tls.enabled() && !IsLoopbackListenAddress(options_.listen)) {
    spdlog::warn("--insecure: serving plaintext on {}", options_.listen);
  }
  client_ = GrpcCoordinatorClient::Connect(options_.coordinator, absl::Seconds(10), options_.token,
                                           options_.tls);
  absl::StatusOr<BackendParts> backend = MakeBackend(
      options_.backend, client_.get(), GlooOptions{options_.gloo_host, options_.same_host_copy});
  if (!backend.ok()) return backend.status();
  device_space_ = std::move(backend->space);
  MemorySpace& base = device_space_ != nullptr ? *device_space_ : HostMemorySpace::Global();
  absl::StatusOr<int64_t> budget_bytes = ResolveMemoryBudget(options_.memory_budget, base);
  if (!budget_bytes.ok()) {
    return absl::Status(budget_bytes.status().code(),
                        absl::StrCat("--memory-budget: ", budget_bytes.status().message()));
  }
  budget_ = std::make_unique<MemoryBudget>(absl::StrCat("worker ", options_.name), *budget_bytes);
  space_ = std::make_unique<BudgetedMemorySpace>(&base, budget_.get());
  if (base.is_host()) {
    // Freed blocks the host cache keeps mapped are not counted: keep them a small part of
    // the budget.
    HostMemoryCache::Global().set_limit(std::min<int64_t>(int64_t{1} << 30, *budget_bytes / 8));
  }
  spdlog::info("memory budget {} bytes ({}) of {}, buckets of at most {} bytes", *budget_bytes,
               FormatBytes(*budget_bytes), base.name(), options_.bucket_bytes);
  communicators_ = std::make_unique<CommunicatorCache>(
      std::move(backend->factory),
      CommunicatorCacheMetrics{metrics_.communicator_builds, metrics_.communicator_aborts});
  registry_.AddCollector([this] {
    metrics_.communicators->Set(static_cast<double>(communicators_->size()));
    metrics_.buffers->Set(static_cast<double>(buffers_.List().size()));
    metrics_.buffer_bytes->Set(static_cast<double>(buffers_.TotalBytes()));
    metrics_.memory_budget->Set(static_cast<double>(budget_->budget()));
    metrics_.memory_used->Set(static_cast<double>(budget_->used()));
    metrics_.memory_peak->Set(static_cast<double>(budget_->peak()));
  });

  ExecutorOptions executor_options;
  executor_options.default_step_timeout = options_.step_timeout;
  executor_options.bucket_bytes = options_.bucket_bytes;
  core_ = std::make_unique<WorkerCore>(
      &buffers_, communicators_.get(), client_.get(), [this] { return Identity(); },
      executor_options, LogInfo, space_.get());
  core_->set_memory_budget(budget_.get());
  absl::StatusOr<std::string> checkpoint_root =
      CheckpointIo::CanonicalRoot(options_.checkpoint_root);
  if (!checkpoint_root.ok()) return checkpoint_root.status();
  checkpoints_ = std::make_unique<CheckpointIo>(&buffers_, space_.get(), *checkpoint_root);
  if (!checkpoint_root->empty()) spdlog::info("checkpoints only under {}", *checkpoint_root);
  service_ = std::make_unique<WorkerServiceImpl>(core_.get(), &pool_, checkpoints_.get());
  attach_ = std::make_unique<AttachRegistry>(
      &buffers_, space_.get(), client_.get(), [this] { return Identity(); }, LogInfo);
  if (absl::Status s = StartLocalSocket(); !s.ok()) return s;
  registry_.AddCollector([this] {
    metrics_.attached_bytes->Set(static_cast<double>(buffers_.LentBytes()));
    metrics_.attachments->Set(static_cast<double>(attach_->attachments()));
  });

  HealthStatus::EnableDefaultService();
  grpc::ServerBuilder builder;
  int port = 0;
  // With --tls-client-auth=require, only a coordinator this worker dials may call it.
  builder.AddListeningPort(
      options_.listen, MakeServerCredentials(options_.tls, CoordinatorHosts(options_.coordinator)),
      &port);
  builder.SetMaxReceiveMessageSize(256 << 20);
  builder.SetMaxSendMessageSize(256 << 20);
  builder.RegisterService(service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeRpcMetricsInterceptor(
      RpcMethods::Of({v1::Worker::service_full_name()}), metrics_.rpcs,
      metrics_.rpc_duration_seconds, metrics_.rpc_message_bytes, LogMalformedCallsRateLimited()));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  grpc_health_.Attach(server_.get());  // NOT_SERVING until registered.
  if (!options_.health_listen.empty()) {
    absl::StatusOr<std::string> health = grpc_health_.ServeOn(options_.health_listen);
    if (!health.ok()) {
      server_->Shutdown(std::chrono::system_clock::now());
      return health.status();
    }
    health_address_ = *health;
  }
  const std::string listen_host = HostOf(options_.listen);
  const std::string address =
      JoinHostPort(IsWildcard(listen_host) ? options_.host : listen_host, port);
  if (!options_.http_listen.empty()) {
    http_.Get("/metrics", [this] {
      return HttpResponse{200, Registry::kContentType, registry_.Render()};
    });
    absl::StatusOr<std::string> http = http_.Start(options_.http_listen);
    if (!http.ok()) {
      server_->Shutdown(std::chrono::system_clock::now());
      return http.status();
    }
    http_address_ = *http;
  }

  AgentOptions agent_options;
  agent_options.registration.set_name(options_.name);
  agent_options.registration.set_host(options_.host);
  agent_options.registration.set_device(device_name);
  agent_options.registration.set_backend(nccl ? "nccl" : "gloo");
  agent_options.registration.set_address(address);
  if (local_server_ != nullptr) agent_options.registration.set_local_socket(local_server_->path());
  agent_options.registration.set_bucket_bytes(options_.bucket_bytes);
  agent_options.memory = [this] {
    MemoryReport m;
    m.budget_bytes = budget_->budget();
    m.used_bytes = budget_->used();
    m.peak_bytes = budget_->peak();
    return m;
  };
  agent_options.log = LogInfo;
  // Buffers survive a coordinator outage; every registration reports them so a restarted
  // coordinator can reconcile, and drops what it says never committed.
  agent_options.held = [this] { return HeldBuffers(); };
  agent_options.before_registering_again = [this] {
    if (int n = core_->AbortAll(); n > 0) {
      spdlog::info("aborted {} plans of the previous incarnation before registering again", n);
    }
  };
  agent_options.drop = [this](const std::string& tensor, int64_t version) {
    v1::DropTensorRequest drop;
    drop.set_tensor(tensor);
    drop.set_version(version);
    core_->DropTensor(drop).IgnoreError();
  };
  agent_options.on_registration = [this](bool registered) {
    grpc_health_.SetReady(registered && !draining_);
  };
  agent_ = std::make_unique<Agent>(client_.get(), agent_options);
  absl::Status registered = agent_->Start(options_.register_timeout);
  if (!registered.ok()) {
    server_->Shutdown(std::chrono::system_clock::now());
    return absl::Status(registered.code(),
                        absl::StrCat("cannot register with the coordinator at ",
                                     options_.coordinator, ": ", registered.ToString()));
  }
  grpc_health_.SetReady(!draining_);
  if (nccl) {
    spdlog::info("worker {} (nccl on {}, buffers in {}) serving on {}, coordinator {}",
                 options_.name, device_name, device_space_->name(), address, options_.coordinator);
  } else {
    spdlog::info("worker {} (gloo on {}, same-host copy {}) serving on {}, coordinator {}",
                 options_.name, options_.gloo_host, options_.same_host_copy ? "on" : "off", address,
                 options_.coordinator);
  }
  return address;
}

std::vector<v1::HeldBuffer> Worker::HeldBuffers() const {
  std::vector<v1::HeldBuffer> out;
  for (const BufferStore::Entry& e : buffers_.List()) {
    std::shared_ptr<HostBuffer> buffer = buffers_.Find(e.tensor, e.version);
    if (buffer == nullptr) continue;  // Dropped meanwhile.
    absl::StatusOr<std::vector<uint64_t>> sums =
        buffer->attached() ? std::vector<uint64_t>(buffer->chunks().chunks.size(), 0)
                           : buffer->Checksums();
    if (!sums.ok()) {
      spdlog::warn("cannot checksum {} version {}: {}", e.tensor, e.version,
                   sums.status().ToString());
      continue;  // Not reported: the coordinator counts it as lost.
    }
    v1::HeldBuffer h;
    h.set_tensor(e.tensor);
    h.set_version(e.version);
    *h.mutable_chunks() = RankChunksToProto(buffer->chunks(), *sums);
    out.push_back(std::move(h));
  }
  return out;
}

absl::Status Worker::StartLocalSocket() {
  if (options_.local_socket.empty()) return absl::OkStatus();
  LocalSocketOptions local{options_.local_socket, options_.local_group};
  absl::StatusOr<std::unique_ptr<LocalSocketServer>> server =
      LocalSocketServer::Start(local, attach_.get(), LogInfo);
  if (!server.ok() && options_.local_socket_default &&
      server.status().code() == absl::StatusCode::kUnavailable) {
    // /run is root's: a worker of another user serves under its own temporary directory.
    const char* tmp = std::getenv("TMPDIR");
    local.path = absl::StrCat(tmp != nullptr && *tmp ? tmp : "/tmp", "/shardcoord-", geteuid(), "/",
                              options_.name, ".sock");
    spdlog::info("local socket {}: {}; using {}", options_.local_socket,
                 std::string(server.status().message()), local.path);
    server = LocalSocketServer::Start(local, attach_.get(), LogInfo);
  }
  if (!server.ok()) return server.status();
  local_server_ = *std::move(server);
  spdlog::info("user processes attach buffers on {}", local_server_->path());
  return absl::OkStatus();
}

void Worker::Drain(absl::Duration timeout) {
  draining_ = true;
  grpc_health_.SetReady(false);
  if (agent_ == nullptr || core_ == nullptr) return;  // Never started.
  const absl::Time deadline = absl::Now() + timeout;
  agent_->Leave();
  const WorkerIdentity id = Identity();
  v1::LeaveWorkerRequest request;
  request.set_name(id.name);
  request.set_incarnation(id.incarnation);
  request.set_drain_timeout_ms(absl::ToInt64Milliseconds(timeout));
  absl::StatusOr<v1::LeaveWorkerResponse> left = client_->Leave(request);
  if (left.ok()) {
    spdlog::info(
        "left the cluster: {} plans aborted at the drain timeout, {} tensors copied to "
        "a surviving replica first",
        left->aborted_plans_size(), left->repaired_tensors_size());
    // A few names, then a count: a model's worth of lost tensors is one line, not 10^5.
    constexpr int kLostNamed = 8;
    for (int i = 0; i < left->lost_size() && i < kLostNamed; ++i) {
      spdlog::warn("chunks lost with this worker (no other live copy): {}", left->lost(i));
    }
    if (left->lost_size() > kLostNamed) {
      spdlog::warn("... and {} more tensors lost chunks with this worker",
                   left->lost_size() - kLostNamed);
    }
  } else {
    spdlog::warn(
        "could not tell the coordinator that this worker leaves ({}); waiting for "
        "running plans",
        left.status().ToString());
  }
  if (!core_->StopAcceptingAndAwaitIdle("worker is draining (leaving the cluster)",
                                        std::max(absl::ZeroDuration(), deadline - absl::Now()))) {
    spdlog::warn("drain timeout: {} plan fragments still run; aborting them", core_->running());
  }
}

bool Worker::Shutdown(absl::Duration grace) {
  if (shut_down_) return stopped_cleanly_;
  shut_down_ = true;
  grpc_health_.Shutdown();
  if (agent_ != nullptr) agent_->Stop();
  // The worker's end tells the coordinator about its lent buffers: no detach reports.
  if (attach_ != nullptr) attach_->Shutdown();
  if (local_server_ != nullptr) local_server_->Stop();
  http_.Stop();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  }
  if (core_ != nullptr) stopped_cleanly_ = core_->Shutdown(grace);
  return stopped_cleanly_;
}

}  // namespace shardcoord
