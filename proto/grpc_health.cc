#include "proto/grpc_health.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"

namespace shardcoord {

void HealthStatus::EnableDefaultService() { grpc::EnableDefaultHealthCheckService(true); }

HealthStatus::~HealthStatus() { Shutdown(); }

void HealthStatus::ApplyLocked(grpc::Server* server) {
  grpc::HealthCheckServiceInterface* health = server->GetHealthCheckService();
  if (health == nullptr) return;  // EnableDefaultService was not called before building it.
  health->SetServingStatus("", ready_);
  health->SetServingStatus(kLivenessService, true);
}

void HealthStatus::Attach(grpc::Server* server) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  servers_.push_back(server);
  ApplyLocked(server);
}

absl::StatusOr<std::string> HealthStatus::ServeOn(const std::string& listen) {
  EnableDefaultService();
  grpc::ServerBuilder builder;
  int port = 0;
  // Only serving statuses cross this port, so plaintext is fine on any address.
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("--health-listen: cannot listen on ", listen));
  }
  const size_t colon = listen.rfind(':');
  const std::string host = colon == std::string::npos ? listen : listen.substr(0, colon);
  absl::MutexLock lock(&mu_);
  own_ = std::move(server);
  servers_.push_back(own_.get());
  ApplyLocked(own_.get());
  return absl::StrCat(host, ":", port);
}

void HealthStatus::SetReady(bool ready) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  ready_ = ready;
  for (grpc::Server* s : servers_) ApplyLocked(s);
}

bool HealthStatus::ready() const {
  absl::MutexLock lock(&mu_);
  return ready_ && !shut_down_;
}

void HealthStatus::Shutdown() {
  std::unique_ptr<grpc::Server> own;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    ready_ = false;
    for (grpc::Server* s : servers_) {
      if (grpc::HealthCheckServiceInterface* h = s->GetHealthCheckService(); h != nullptr) {
        h->Shutdown();  // NOT_SERVING for every service, and no further changes.
      }
    }
    servers_.clear();
    own = std::move(own_);
  }
  if (own != nullptr) own->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace shardcoord
