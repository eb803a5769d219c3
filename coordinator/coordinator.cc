#include "coordinator/coordinator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tls_options.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_credentials.h"
#include "spdlog/spdlog.h"

namespace shardcoord {
namespace {

class DeathLogger : public WorkerListener {
 public:
  void OnWorkerLost(const WorkerRecord& w, const std::string& reason) override {
    spdlog::warn("{} incarnation {} {}", w.Describe(), w.incarnation, reason);
  }
};

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options)
    : options_(std::move(options)),
      workers_(&clock_, options_.heartbeat_timeout),
      meshes_(&workers_),
      tensors_(&meshes_),
      kv_(&timer_) {
  client_ = std::make_unique<GrpcWorkerClient>(options_.worker_client);
  PlanManagerOptions po;
  po.plan_timeout = options_.plan_timeout;
  po.step_timeout = options_.plan_timeout;
  po.use_collectives = options_.use_collectives;
  // A dead peer is declared at most heartbeat_timeout + one health tick (<= one interval)
  // after its last heartbeat, which came at most one interval before it died; its echo in a
  // peer's error can arrive at once. Waiting less races the death being noticed.
  po.failure_grace = options_.heartbeat_timeout + 2 * options_.heartbeat_interval;
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
  io_ = std::make_unique<TensorIo>(&workers_, &meshes_, &tensors_, client_.get(),
                                   options_.io_band_bytes);
  service_ = std::make_unique<CoordinatorService>(
      &workers_, &meshes_, &tensors_, plans_.get(), io_.get(),
      options_.worker_client.chunk_message_bytes, options_.auth ? &*options_.auth : nullptr);
  worker_service_ = std::make_unique<WorkerFacingService>(
      &clock_, &workers_, &kv_, plans_.get(), options_.heartbeat_interval,
      options_.auth ? &*options_.auth : nullptr,
      options_.worker_client.tls.client_auth == TlsClientAuth::kRequire);
  death_logger_ = std::make_unique<DeathLogger>();
  workers_.AddListener(plans_.get());
  workers_.AddListener(death_logger_.get());
}

Coordinator::~Coordinator() { Shutdown(); }

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
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, MakeServerCredentials(tls), &port);
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.RegisterService(service_.get());
  builder.RegisterService(worker_service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.listen));
  }
  health_ = std::thread([this] { HealthLoop(); });
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
    workers_.CheckHealth(clock_.Now());
    mu_.Lock();
  }
}

void Coordinator::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    stopping_ = true;
  }
  if (health_.joinable()) health_.join();
  // Everything a reactor may wait on completes first, so the server's shutdown returns.
  plans_->Shutdown("coordinator shutting down");
  kv_.CancelAll(absl::UnavailableError("coordinator shutting down"));
  client_->CancelAll();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  timer_.Stop();
  client_.reset();  // Waits for the callbacks of cancelled calls.
}

}  // namespace shardcoord
