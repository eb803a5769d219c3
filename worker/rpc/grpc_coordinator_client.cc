#include "worker/rpc/grpc_coordinator_client.h"

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

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const TlsOptions& tls) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // A restarted coordinator is found within a second, however long it was away (gRPC's
  // reconnect backoff otherwise grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, MakeChannelCredentials(tls), args);
}

}  // namespace

GrpcCoordinatorClient::GrpcCoordinatorClient(std::shared_ptr<grpc::Channel> channel,
                                             absl::Duration rpc_timeout, std::string token)
    : rpc_timeout_(rpc_timeout), token_(std::move(token)), addresses_("") {
  absl::MutexLock lock(&mu_);
  stubs_.push_back(v1::CoordinatorWorkers::NewStub(std::move(channel)));
}

GrpcCoordinatorClient::GrpcCoordinatorClient(const std::string& addresses,
                                             absl::Duration rpc_timeout, std::string token,
                                             const TlsOptions& tls)
    : rpc_timeout_(rpc_timeout), token_(std::move(token)), tls_(tls), addresses_(addresses) {}

void GrpcCoordinatorClient::Prepare(grpc::ClientContext* ctx, absl::Duration timeout) const {
  ctx->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  if (!token_.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
}

std::unique_ptr<GrpcCoordinatorClient> GrpcCoordinatorClient::Connect(const std::string& address,
                                                                      absl::Duration rpc_timeout,
                                                                      std::string token,
                                                                      const TlsOptions& tls) {
  return std::unique_ptr<GrpcCoordinatorClient>(
      new GrpcCoordinatorClient(address, rpc_timeout, std::move(token), tls));
}

std::shared_ptr<GrpcCoordinatorClient::Stub> GrpcCoordinatorClient::Current(size_t* index) {
  *index = addresses_.current();
  absl::MutexLock lock(&mu_);
  if (stubs_.size() <= *index) stubs_.resize(*index + 1);
  std::shared_ptr<Stub>& stub = stubs_[*index];
  if (stub == nullptr)
    stub = v1::CoordinatorWorkers::NewStub(MakeChannel(addresses_.at(*index), tls_));
  return stub;
}

void GrpcCoordinatorClient::Note(size_t index, const grpc::ClientContext& ctx,
                                 const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return;
  std::string leader;
  const auto& trailers = ctx.GetServerTrailingMetadata();
  if (auto it = trailers.find(kLeaderMetadataKey); it != trailers.end()) {
    leader.assign(it->second.data(), it->second.size());
  }
  addresses_.Unavailable(index, leader);
}

absl::StatusOr<v1::RegisterWorkerResponse> GrpcCoordinatorClient::Register(
    const v1::RegisterWorkerRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::RegisterWorkerResponse response;
  size_t index;
  grpc::Status s = Current(&index)->RegisterWorker(&ctx, request, &response);
  Note(index, ctx, s);
  if (!s.ok()) return FromGrpc(s, "RegisterWorker");
  return response;
}

absl::Status GrpcCoordinatorClient::Heartbeat(const v1::HeartbeatRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::HeartbeatResponse response;
  size_t index;
  grpc::Status s = Current(&index)->Heartbeat(&ctx, request, &response);
  Note(index, ctx, s);
  return FromGrpc(s, "Heartbeat");
}

absl::StatusOr<v1::LeaveWorkerResponse> GrpcCoordinatorClient::Leave(
    const v1::LeaveWorkerRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, absl::Milliseconds(request.drain_timeout_ms()) + rpc_timeout_);
  v1::LeaveWorkerResponse response;
  size_t index;
  grpc::Status g = Current(&index)->LeaveWorker(&ctx, request, &response);
  Note(index, ctx, g);
  absl::Status s = FromGrpc(g, "LeaveWorker");
  if (!s.ok()) return s;
  return response;
}

absl::Status GrpcCoordinatorClient::ReportChunks(const v1::ReportChunksRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::ReportChunksResponse response;
  size_t index;
  grpc::Status s = Current(&index)->ReportChunks(&ctx, request, &response);
  Note(index, ctx, s);
  return FromGrpc(s, "ReportChunks");
}

absl::StatusOr<v1::AttachBufferResponse> GrpcCoordinatorClient::AttachBuffer(
    const v1::AttachBufferRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::AttachBufferResponse response;
  // The coordinator's message goes to the user process as it is (it names the field).
  size_t index;
  grpc::Status g = Current(&index)->AttachBuffer(&ctx, request, &response);
  Note(index, ctx, g);
  absl::Status s = FromGrpcStatus(g);
  if (!s.ok()) return s;
  return response;
}

absl::Status GrpcCoordinatorClient::DetachBuffer(const v1::DetachBufferRequest& request) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::DetachBufferResponse response;
  size_t index;
  grpc::Status s = Current(&index)->DetachBuffer(&ctx, request, &response);
  Note(index, ctx, s);
  return FromGrpc(s, "DetachBuffer");
}

absl::StatusOr<v1::AttachBuffersResponse> GrpcCoordinatorClient::AttachBuffers(
    const v1::AttachBuffersRequest& request) {
  grpc::ClientContext ctx;
  // A whole model's buffers are checked and stored in one batch: time for each.
  Prepare(&ctx, rpc_timeout_ + absl::Milliseconds(request.buffers_size()));
  v1::AttachBuffersResponse response;
  // As AttachBuffer's: the message (naming buffers[i]) goes to the user process as it is.
  size_t index;
  grpc::Status g = Current(&index)->AttachBuffers(&ctx, request, &response);
  Note(index, ctx, g);
  absl::Status s = FromGrpcStatus(g);
  if (!s.ok()) return s;
  return response;
}

absl::Status GrpcCoordinatorClient::Set(absl::string_view key, absl::string_view value) {
  grpc::ClientContext ctx;
  Prepare(&ctx, rpc_timeout_);
  v1::KvSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::KvSetResponse response;
  size_t index;
  grpc::Status s = Current(&index)->KvSet(&ctx, request, &response);
  Note(index, ctx, s);
  return FromGrpc(s, absl::StrCat("KvSet '", key, "'"));
}

absl::StatusOr<std::string> GrpcCoordinatorClient::Get(absl::string_view key,
                                                       absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, std::max(timeout, absl::ZeroDuration()) + rpc_timeout_);
  v1::KvGetRequest request;
  request.set_key(std::string(key));
  request.set_timeout_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
  v1::KvGetResponse response;
  size_t index;
  grpc::Status s = Current(&index)->KvGet(&ctx, request, &response);
  Note(index, ctx, s);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("KvGet '", key, "'"));
  return std::move(*response.mutable_value());
}

}  // namespace shardcoord
