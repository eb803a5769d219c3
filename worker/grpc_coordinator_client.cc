#include "worker/grpc_coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/grpc_credentials.h"
#include "proto/grpc_status.h"

namespace shardcoord {
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  absl::Status status = FromGrpcStatus(s);
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

}  // namespace

GrpcCoordinatorClient::GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                             absl::Duration rpc_timeout, std::string token)
    : channel_(std::move(channel)),
      stub_(v1::CoordinatorWorkers::NewStub(channel_)),
      rpc_timeout_(rpc_timeout),
      token_(std::move(token)) {}

void GrpcCoordinatorClient::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
}

std::unique_ptr<GrpcCoordinatorClient> GrpcCoordinatorClient::Connect(const std::string& address,
                                                                      absl::Duration rpc_timeout,
                                                                      std::string token,
                                                                      const TlsOptions& tls) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // A restarted coordinator is found within a second, however long it was away (gRPC's
  // reconnect backoff otherwise grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return std::make_unique<GrpcCoordinatorClient>(
      grpc::CreateCustomChannel(address, MakeChannelCredentials(tls), args), rpc_timeout,
      std::move(token));
}

absl::StatusOr<v1::RegisterWorkerResponse> GrpcCoordinatorClient::Register(
    const v1::RegisterWorkerRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::RegisterWorkerResponse response;
  grpc::Status s = stub_->RegisterWorker(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s, "RegisterWorker");
  return response;
}

absl::Status GrpcCoordinatorClient::Heartbeat(const v1::HeartbeatRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::HeartbeatResponse response;
  return FromGrpc(stub_->Heartbeat(&ctx, request, &response), "Heartbeat");
}

absl::StatusOr<v1::LeaveWorkerResponse> GrpcCoordinatorClient::Leave(
    const v1::LeaveWorkerRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::Milliseconds(request.drain_timeout_ms()) + rpc_timeout_);
  v1::LeaveWorkerResponse response;
  absl::Status s = FromGrpc(stub_->LeaveWorker(&ctx, request, &response), "LeaveWorker");
  if (!s.ok()) return s;
  return response;
}

absl::Status GrpcCoordinatorClient::ReportChunks(const v1::ReportChunksRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::ReportChunksResponse response;
  return FromGrpc(stub_->ReportChunks(&ctx, request, &response), "ReportChunks");
}

absl::StatusOr<v1::AttachBufferResponse> GrpcCoordinatorClient::AttachBuffer(
    const v1::AttachBufferRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::AttachBufferResponse response;
  // The coordinator's message goes to the user process as it is (it names the field).
  absl::Status s = FromGrpcStatus(stub_->AttachBuffer(&ctx, request, &response));
  if (!s.ok()) return s;
  return response;
}

absl::Status GrpcCoordinatorClient::DetachBuffer(const v1::DetachBufferRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::DetachBufferResponse response;
  return FromGrpc(stub_->DetachBuffer(&ctx, request, &response), "DetachBuffer");
}

absl::Status GrpcCoordinatorClient::Set(absl::string_view key, absl::string_view value) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::KvSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::KvSetResponse response;
  return FromGrpc(stub_->KvSet(&ctx, request, &response), absl::StrCat("KvSet '", key, "'"));
}

absl::StatusOr<std::string> GrpcCoordinatorClient::Get(absl::string_view key,
                                                       absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, std::max(timeout, absl::ZeroDuration()) + rpc_timeout_);
  v1::KvGetRequest request;
  request.set_key(std::string(key));
  request.set_timeout_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
  v1::KvGetResponse response;
  grpc::Status s = stub_->KvGet(&ctx, request, &response);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("KvGet '", key, "'"));
  return std::move(*response.mutable_value());
}

}  // namespace shardcoord
