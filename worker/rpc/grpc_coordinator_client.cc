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

// `*response` when `status` is OK, else `status`.
template <typename Response>
absl::StatusOr<Response> Answer(const absl::Status& status, Response* response) {
  if (!status.ok()) return status;
  return std::move(*response);
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

template <typename Request, typename Response>
grpc::Status GrpcCoordinatorClient::Call(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                                      const Request&, Response*),
                                         const Request& request, Response* response,
                                         absl::Duration timeout) {
  grpc::ClientContext ctx;
  Prepare(&ctx, timeout);
  size_t index;
  grpc::Status s = (Current(&index).get()->*method)(&ctx, request, response);
  Note(index, ctx, s);
  return s;
}

absl::StatusOr<v1::RegisterWorkerResponse> GrpcCoordinatorClient::Register(
    const v1::RegisterWorkerRequest& request) {
  v1::RegisterWorkerResponse response;
  return Answer(
      FromGrpc(Call(&Stub::RegisterWorker, request, &response, rpc_timeout_), "RegisterWorker"),
      &response);
}

absl::Status GrpcCoordinatorClient::Heartbeat(const v1::HeartbeatRequest& request) {
  v1::HeartbeatResponse response;
  return FromGrpc(Call(&Stub::Heartbeat, request, &response, rpc_timeout_), "Heartbeat");
}

absl::StatusOr<v1::LeaveWorkerResponse> GrpcCoordinatorClient::Leave(
    const v1::LeaveWorkerRequest& request) {
  v1::LeaveWorkerResponse response;
  return Answer(FromGrpc(Call(&Stub::LeaveWorker, request, &response,
                              absl::Milliseconds(request.drain_timeout_ms()) + rpc_timeout_),
                         "LeaveWorker"),
                &response);
}

absl::Status GrpcCoordinatorClient::ReportChunks(const v1::ReportChunksRequest& request) {
  v1::ReportChunksResponse response;
  return FromGrpc(Call(&Stub::ReportChunks, request, &response, rpc_timeout_), "ReportChunks");
}

absl::StatusOr<v1::AttachBufferResponse> GrpcCoordinatorClient::AttachBuffer(
    const v1::AttachBufferRequest& request) {
  v1::AttachBufferResponse response;
  // The coordinator's message goes to the user process as it is (it names the field).
  return Answer(FromGrpcStatus(Call(&Stub::AttachBuffer, request, &response, rpc_timeout_)),
                &response);
}

absl::Status GrpcCoordinatorClient::DetachBuffer(const v1::DetachBufferRequest& request) {
  v1::DetachBufferResponse response;
  return FromGrpc(Call(&Stub::DetachBuffer, request, &response, rpc_timeout_), "DetachBuffer");
}

absl::StatusOr<v1::AttachBuffersResponse> GrpcCoordinatorClient::AttachBuffers(
    const v1::AttachBuffersRequest& request) {
  v1::AttachBuffersResponse response;
  // A whole model's buffers are checked and stored in one batch: time for each. As
  // AttachBuffer's: the message (naming buffers[i]) goes to the user process as it is.
  return Answer(FromGrpcStatus(Call(&Stub::AttachBuffers, request, &response,
                                    rpc_timeout_ + absl::Milliseconds(request.buffers_size()))),
                &response);
}

absl::Status GrpcCoordinatorClient::Set(absl::string_view key, absl::string_view value) {
  v1::KvSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::KvSetResponse response;
  return FromGrpc(Call(&Stub::KvSet, request, &response, rpc_timeout_),
                  absl::StrCat("KvSet '", key, "'"));
}

absl::StatusOr<std::string> GrpcCoordinatorClient::Get(absl::string_view key,
                                                       absl::Duration timeout) {
  v1::KvGetRequest request;
  request.set_key(std::string(key));
  request.set_timeout_ms(std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout)));
  v1::KvGetResponse response;
  grpc::Status s = Call(&Stub::KvGet, request, &response,
                        std::max(timeout, absl::ZeroDuration()) + rpc_timeout_);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("KvGet '", key, "'"));
  return std::move(*response.mutable_value());
}

}  // namespace shardcoord
