#include "coordinator/coordinator.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/tls_options.h"
#include "coordinator/rpc/grpc_leader_hint.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_credentials.h"
#include "proto/malformed_log.h"
#include "proto/rpc_metrics.h"
#include "proto/shardcoord.grpc.pb.h"
#include "spdlog/spdlog.h"

namespace shardcoord {
namespace {

// Every reaction to a worker incarnation's end (declared dead, or replaced by a new
// registration) and to its memory reports, in one place, as Ray's GCS InstallEventListeners:
// the one listener the worker manager tells (on the thread that noticed, no lock held).
class WorkerEvents : public WorkerListener {
 public:
  WorkerEvents(PlanManager* plans, TransferManager* transfers, ClusterMemoryView* memory,
               TensorIo* io, CheckpointManager* checkpoints, AttachManager* attach)
      : plans_(plans),
        transfers_(transfers),
        memory_(memory),
        io_(io),
        checkpoints_(checkpoints),
        attach_(attach) {}

  void OnWorkerLost(const WorkerRecord& w, const std::string& reason) override {
    // Plans first: they abort what used it, which frees the tensors others wait for.
    plans_->OnWorkerLost(w, reason);
    // Transfers with a part on it prepare again before their next run; a run aborts.
    transfers_->OnWorkerLost(w, reason);
    spdlog::warn("{} incarnation {} {}", w.Describe(), w.incarnation, reason);
    memory_->OnWorkerLost(w, reason);
    // Uploads, downloads, saves and loads using it fail now, naming it, not at an RPC error.
    io_->OnWorkerLost(w, reason);
    checkpoints_->OnWorkerLost(w, reason);
    if (std::vector<std::string> lent = attach_->OnWorkerLost(w); !lent.empty()) {
      spdlog::warn("{}: the buffers lent for '{}' are unreadable until it registers again",
                   w.Describe(), absl::StrJoin(lent, "', '"));
    }
  }
  void OnWorkerMemory(const WorkerRecord& w) override {
    plans_->OnWorkerMemory(w);
    memory_->OnWorkerMemory(w);  // Memory reports re-check waiting plans.
  }

 private:
  PlanManager* const plans_;
  TransferManager* const transfers_;
  ClusterMemoryView* const memory_;
  TensorIo* const io_;
  CheckpointManager* const checkpoints_;
  AttachManager* const attach_;
};

std::unique_ptr<StateStore> OpenStore(const CoordinatorOptions& options, absl::Status* status) {
  absl::StatusOr<std::unique_ptr<StateStore>> store =
      OpenStateStore(options.state, &options.etcd_store);
  if (store.ok()) return *std::move(store);
  *status = store.status();
  return std::make_unique<MemoryStateStore>();  // Unused: Start fails with `status`.
}

// Counts the starts of a coordinator over one store: new plan ids and rendezvous prefixes.
absl::StatusOr<int64_t> NextBoot(StateStore* store) {
  absl::StatusOr<std::vector<StateRecord>> counters = store->Load("counter");
  if (!counters.ok()) return counters.status();
  int64_t boot = 0;
  for (const StateRecord& r : *counters) {
    if (r.name == "boot" && !absl::SimpleAtoi(r.value, &boot)) {
      return absl::InternalError("state store: bad boot counter");
    }
  }
  ++boot;
  if (absl::Status s = store->Put("counter", "boot", absl::StrCat(boot)); !s.ok()) return s;
  return boot;
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options)
    : options_(std::move(options)),
      metrics_(&registry_),
      store_(OpenStore(options_, &init_status_)),
      workers_(&clock_, options_.heartbeat_timeout, store_.get()),
      meshes_(&workers_, store_.get()),
      tensors_(&meshes_, store_.get()),
      requests_(store_.get(), &clock_),
      watches_("watch streams", "--max-watches-per-caller", options_.max_watches_per_caller),
      running_plans_("running plans", "--max-plans-per-caller", options_.max_plans_per_caller),
      registration_(&workers_, &tensors_),
      kv_(&timer_) {
  std::string id_namespace;
  if (init_status_.ok() && options_.state.durable()) {
    init_status_ = workers_.Load();
    if (init_status_.ok()) init_status_ = meshes_.Load();
    if (init_status_.ok()) {
      init_status_ = tensors_.Load([this](int64_t rank, int64_t incarnation) {
        return workers_.WasLiveBeforeRestart(rank, incarnation);
      });
    }
    if (init_status_.ok()) init_status_ = requests_.Load();
    if (init_status_.ok()) {
      absl::StatusOr<int64_t> boot = NextBoot(store_.get());
      if (boot.ok()) {
        id_namespace = absl::StrCat(*boot);
      } else {
        init_status_ = boot.status();
      }
    }
  }
  GrpcWorkerClientOptions worker_client = options_.worker_client;
  worker_client.message_bytes = metrics_.rpc_message_bytes;
  client_ = std::make_unique<GrpcWorkerClient>(worker_client);
  memory_view_ = std::make_unique<ClusterMemoryView>(&workers_, &tensors_);
  AdmissionOptions admission;
  admission.timeout = options_.admission_timeout;
  admission.metrics.wait_seconds = metrics_.admission_wait_seconds;
  admission_ =
      std::make_unique<AdmissionController>(&clock_, &timer_, memory_view_.get(), admission);
  memory_view_->set_controller(admission_.get());
  PlanManagerOptions po;
  po.admission = admission_.get();
  po.plan_timeout = options_.plan_timeout;
  po.step_timeout = options_.plan_timeout;
  po.use_collectives = options_.use_collectives;
  po.relay_max_bytes = options_.relay_max_bytes;
  po.id_namespace = id_namespace;
  // A dead peer is declared at most heartbeat_timeout + one health tick (<= one interval)
  // after its last heartbeat, which came at most one interval before it died; its echo in a
  // peer's error can arrive at once. Waiting less races the death being noticed.
  const absl::Duration po_failure_grace =
      options_.heartbeat_timeout + 2 * options_.heartbeat_interval;
  po.failure_grace = po_failure_grace;
  po.metrics = &metrics_;
  po.on_plan_end = [this](const PlanProgress& p, const std::string& prefix) {
    if (!prefix.empty()) kv_.DeletePrefix(prefix);
    if (p.state == PlanState::kCommitted) {
      spdlog::info("plan {} on {} committed: {} bytes in {:.3f}s", p.plan_id, p.tensor,
                   p.bytes_total, p.seconds);
    } else {
      spdlog::warn("plan {} on {} aborted: {}", p.plan_id, p.tensor, p.error);
    }
  };
  plans_ = std::make_unique<PlanManager>(&clock_, &timer_, &workers_, &meshes_, &tensors_,
                                         client_.get(), std::move(po));
  drain_ = std::make_unique<WorkerDrain>(&clock_, &timer_, &workers_, &tensors_, plans_.get());
  io_ = std::make_unique<TensorIo>(&workers_, &meshes_, &tensors_, client_.get(),
                                   options_.io_band_bytes, options_.max_tensor_bytes);
  io_->set_admission(admission_.get());
  CheckpointManagerOptions co;
  co.metrics = &metrics_;
  checkpoints_ = std::make_unique<CheckpointManager>(&clock_, &workers_, &meshes_, &tensors_,
                                                     plans_.get(), client_.get(), co);
  TransferManagerOptions to;
  to.run_timeout = options_.plan_timeout;
  to.step_timeout = options_.plan_timeout;
  to.failure_grace = po_failure_grace;
  to.id_namespace = id_namespace;
  to.prepare_threads = 1;
  to.admission = admission_.get();
  to.metrics = &metrics_;
  to.on_run_end = [](const PlanProgress& p) {
    if (p.state == PlanState::kCommitted) {
      spdlog::info("run {} of {} committed: {} bytes in {:.3f}s", p.plan_id, p.tensor,
                   p.bytes_total, p.seconds);
    } else {
      spdlog::warn("run {} of {} aborted: {}", p.plan_id, p.tensor, p.error);
    }
  };
  to.on_prefix_retired = [this](const std::string& prefix) { kv_.DeletePrefix(prefix); };
  transfers_ = std::make_unique<TransferManager>(&clock_, &timer_, &workers_, &tensors_,
                                                 client_.get(), store_.get(), std::move(to));
  // Before any worker registers: their reconcile reads the dsts' versions through the
  // transfers' bindings.
  if (init_status_.ok() && options_.state.durable()) init_status_ = transfers_->Load();
  block_copy_ =
      std::make_unique<BlockCopy>(&clock_, &tensors_, plans_.get(), &workers_, client_.get());
  slices_ = std::make_unique<SliceCopier>(&workers_, &tensors_, client_.get(), plans_.get());
  service_ = std::make_unique<CoordinatorService>(
      &workers_, &meshes_, &tensors_, plans_.get(), io_.get(),
      options_.worker_client.chunk_message_bytes, &metrics_,
      options_.auth ? &*options_.auth : nullptr, &requests_, &watches_, &running_plans_,
      checkpoints_.get(), transfers_.get(), block_copy_.get(), slices_.get());
  attach_ = std::make_unique<AttachManager>(&workers_, &tensors_, plans_.get());
  worker_service_ = std::make_unique<WorkerFacingService>(
      &clock_, &workers_, &registration_, &kv_, plans_.get(), attach_.get(),
      options_.heartbeat_interval, options_.auth ? &*options_.auth : nullptr,
      options_.worker_client.tls.client_auth == TlsClientAuth::kRequire, drain_.get());
  InstallEventListeners();
  registry_.AddCollector([this] {
    int64_t alive = 0, dead = 0;
    for (const WorkerRecord& w : workers_.List()) {
      ++(w.alive ? alive : dead);
      if (w.spec.memory.budget_bytes <= 0) continue;  // Reports no budget.
      const WorkerMemory& m = w.spec.memory;
      metrics_.worker_memory_budget->WithLabels({w.spec.name})
          ->Set(static_cast<double>(m.budget_bytes));
      metrics_.worker_memory_used->WithLabels({w.spec.name})
          ->Set(static_cast<double>(m.used_bytes));
      metrics_.worker_memory_peak->WithLabels({w.spec.name})
          ->Set(static_cast<double>(m.peak_bytes));
    }
    metrics_.workers->WithLabels({"alive"})->Set(static_cast<double>(alive));
    metrics_.workers->WithLabels({"dead"})->Set(static_cast<double>(dead));
    metrics_.admission_waiting->Set(static_cast<double>(admission_->waiting()));
  });
  http_.Get("/metrics", [this] {
    return HttpResponse{200, Registry::kContentType, registry_.Render()};
  });
  dashboard_ = std::make_unique<Dashboard>(&workers_, &meshes_, &tensors_, plans_.get(),
                                           options_.auth ? &*options_.auth : nullptr);
  dashboard_->Register(http_);
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::InstallEventListeners() {
  worker_events_ =
      std::make_unique<WorkerEvents>(plans_.get(), transfers_.get(), memory_view_.get(), io_.get(),
                                     checkpoints_.get(), attach_.get());
  workers_.AddListener(worker_events_.get());
}

absl::StatusOr<std::string> Coordinator::Start() {
  const TlsOptions& tls = options_.worker_client.tls;
  if (absl::Status s =
          CheckPlaintextListen("listen", options_.listen, tls.enabled(), options_.insecure);
      !s.ok()) {
    return s;
  }
  if (!tls.enabled() && !IsLoopbackListenAddress(options_.listen)) {
    spdlog::warn(
        "--insecure: serving plaintext on {}: tokens and tensors cross the network "
        "in clear text",
        options_.listen);
  }
  if (!init_status_.ok()) return init_status_;
  // Until then, operations that need a worker not registered again answer UNAVAILABLE.
  timer_.Schedule(absl::Now() + options_.recovery_timeout, [this] { workers_.EndAwaiting(); });
  if (std::vector<std::string> recovering = tensors_.Recovering(); !recovering.empty()) {
    spdlog::info("recovering {} tensors from {}: waiting up to {} for their workers",
                 recovering.size(), store_->Describe(),
                 absl::FormatDuration(options_.recovery_timeout));
    timer_.Schedule(absl::Now() + options_.recovery_timeout, [this] {
      std::vector<std::string> left = tensors_.Recovering();
      if (left.empty()) return;
      tensors_.EndRecovery();
      spdlog::warn(
          "recovery timeout: {} tensors lost the chunks of workers that did not "
          "register again: {}",
          left.size(), absl::StrJoin(left, ", "));
    });
  }
  HealthStatus::EnableDefaultService();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, MakeServerCredentials(tls), &port);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  builder.RegisterService(service_.get());
  builder.RegisterService(worker_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeRpcMetricsInterceptor(
      RpcMethods::Of(
          {v1::Coordinator::service_full_name(), v1::CoordinatorWorkers::service_full_name()}),
      metrics_.rpcs, metrics_.rpc_duration_seconds, metrics_.rpc_message_bytes,
      LogMalformedCallsRateLimited()));
  if (!options_.leader_hint.empty()) {
    interceptors.push_back(MakeLeaderHintInterceptor(options_.leader_hint));
  }
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  if (!options_.http_listen.empty()) {
    absl::StatusOr<std::string> http = http_.Start(options_.http_listen);
    if (!http.ok()) return http.status();
    http_address_ = *http;
  }
  grpc_health_.Attach(server_.get());
  if (!options_.health_listen.empty()) {
    absl::StatusOr<std::string> health = grpc_health_.ServeOn(options_.health_listen);
    if (!health.ok()) return health.status();
    health_address_ = *health;
  }
  health_ = std::thread([this] { HealthLoop(); });
  grpc_health_.SetReady(true);
  const size_t colon = options_.listen.rfind(':');
  const std::string host =
      colon == std::string::npos ? options_.listen : options_.listen.substr(0, colon);
  return absl::StrCat(host, ":", port);
}

void Coordinator::HealthLoop() {
  // Checks often enough that a death is noticed within a fraction of the timeout.
  const absl::Duration tick =
      std::max(absl::Milliseconds(20),
               std::min(options_.heartbeat_interval, options_.heartbeat_timeout / 4));
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), tick);
    if (stopping_) break;
    mu_.Unlock();
    const absl::Time now = clock_.Now();
    // Heartbeats missed while handlers waited on the state store (etcd away) are not the
    // workers' fault: no deaths until a heartbeat timeout after the trouble.
    if (now - store_->LastTrouble() >= options_.heartbeat_timeout) {
      metrics_.heartbeats_missed->Increment(static_cast<double>(workers_.CheckHealth(now).size()));
    }
    mu_.Lock();
  }
}

int Coordinator::Drain(absl::Duration timeout) {
  grpc_health_.SetReady(false);
  plans_->Close("coordinator is draining (shutting down); retry against its replacement");
  transfers_->Close("coordinator is draining (shutting down); retry against its replacement");
  slices_->Close("coordinator is draining (shutting down); retry against its replacement");
  const absl::Time deadline = absl::Now() + timeout;
  if (plans_->AwaitIdle(deadline) && slices_->AwaitIdle(deadline)) return 0;
  return static_cast<int>(plans_->RunningPlansCount() + transfers_->RunningCount() +
                          slices_->RunningCount());
}

void Coordinator::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
  }
  grpc_health_.Shutdown();
  if (health_.joinable()) health_.join();
  http_.Stop();
  // Everything a reactor may wait on completes first, so the server's shutdown returns.
  plans_->Shutdown("coordinator shutting down");
  transfers_->Shutdown("coordinator shutting down");
  kv_.CancelAll(absl::UnavailableError("coordinator shutting down"));
  client_->CancelAll();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  timer_.Stop();
  client_.reset();  // Waits for the callbacks of cancelled calls.
}

}  // namespace shardcoord
