#include "coordinator/rpc/standby_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/coordinator_addresses.h"
#include "grpcpp/grpcpp.h"

namespace shardcoord {
namespace {

class Refusal : public grpc::ServerGenericBidiReactor {
 public:
  Refusal(grpc::GenericCallbackServerContext* ctx, const std::string& leader,
          const std::string& where) {
    std::string message;
    if (leader.empty()) {
      message = absl::StrCat(ctx->method(), ": this coordinator is a standby and no leader ",
                             "serves yet (", where, "); retry");
    } else {
      ctx->AddTrailingMetadata(kLeaderMetadataKey, leader);
      message = absl::StrCat(ctx->method(), ": this coordinator is a standby; the leader is ",
                             leader, " (", where, ")");
    }
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, message));
  }
  void OnDone() override { delete this; }
};

}  // namespace

StandbyService::StandbyService(std::function<std::string()> leader, std::string where)
    : leader_(std::move(leader)), where_(std::move(where)) {}

grpc::ServerGenericBidiReactor* StandbyService::CreateReactor(
    grpc::GenericCallbackServerContext* ctx) {
  return new Refusal(ctx, leader_(), where_);
}

absl::StatusOr<std::unique_ptr<StandbyServer>> StandbyServer::Start(
    const std::string& listen, std::shared_ptr<grpc::ServerCredentials> credentials,
    const std::string& health_listen, std::function<std::string()> leader, std::string where) {
  std::unique_ptr<StandbyServer> s(new StandbyServer());
  s->service_ = std::make_unique<StandbyService>(std::move(leader), std::move(where));
  HealthStatus::EnableDefaultService();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, std::move(credentials), &port);
  builder.RegisterCallbackGenericService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen));
  }
  const size_t colon = listen.rfind(':');
  s->address_ =
      absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
  s->health_.Attach(s->server_.get());
  s->health_.SetReady(false);
  if (!health_listen.empty()) {
    absl::StatusOr<std::string> health = s->health_.ServeOn(health_listen);
    if (!health.ok()) return health.status();
    s->health_address_ = *health;
  }
  return s;
}

StandbyServer::~StandbyServer() { Shutdown(); }

void StandbyServer::Shutdown() {
  health_.Shutdown();
  if (server_ != nullptr) {
    // Every call ends at once, so this returns at once.
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
}

}  // namespace shardcoord
