#include "client/coordinator_client.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "proto/grpc_credentials.h"

namespace shardcoord {
namespace {

// Plans of big meshes and tensor layouts with many chunks exceed gRPC's 4 MiB default.
constexpr int kMaxReceiveMessageBytes = 1 << 30;

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address, const TlsOptions& tls) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReceiveMessageBytes);
  // Find a restarted coordinator within a second (gRPC's backoff grows to two minutes), so
  // that retries of UNAVAILABLE meet it soon.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  return grpc::CreateCustomChannel(address, MakeChannelCredentials(tls), args);
}

}  // namespace

std::string DefaultCoordinatorAddress() {
  const char* env = std::getenv("SHARDCOORD_ADDR");
  if (env != nullptr && env[0] != '\0') return env;
  return "127.0.0.1:7400";
}

CoordinatorClient::CoordinatorClient(const std::string& address, CoordinatorClientOptions options)
    : address_(address),
      options_(options),
      addresses_(std::make_unique<CoordinatorAddresses>(address)) {
  options_.upload_chunk_bytes =
      std::clamp<size_t>(options_.upload_chunk_bytes, 1, kMaxDataMessageBytes);
}

CoordinatorClient::CoordinatorClient(std::shared_ptr<grpc::ChannelInterface> channel,
                                     std::string address, CoordinatorClientOptions options)
    : CoordinatorClient(address, options) {
  absl::MutexLock lock(&mu_);
  stubs_.push_back(v1::Coordinator::NewStub(std::move(channel)));
}

std::string CoordinatorClient::current_address() const {
  return addresses_->at(addresses_->current());
}

std::shared_ptr<CoordinatorClient::Stub> CoordinatorClient::Current(size_t* index) {
  *index = addresses_->current();
  absl::MutexLock lock(&mu_);
  if (stubs_.size() <= *index) stubs_.resize(*index + 1);
  std::shared_ptr<Stub>& stub = stubs_[*index];
  if (stub == nullptr) {
    stub = v1::Coordinator::NewStub(MakeChannel(addresses_->at(*index), options_.tls));
  }
  return stub;
}

bool CoordinatorClient::Note(size_t index, const grpc::ClientContext& context,
                             const grpc::Status& status) {
  if (status.ok()) {
    addresses_->Succeeded(index);
    return false;
  }
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
  std::string leader;
  const auto& trailers = context.GetServerTrailingMetadata();
  if (auto it = trailers.find(kLeaderMetadataKey); it != trailers.end()) {
    leader.assign(it->second.data(), it->second.size());
  }
  addresses_->Unavailable(index, leader);
  return !leader.empty() && addresses_->current() != index;
}

std::string NewRequestId() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

std::string DefaultToken() {
  const char* env = std::getenv("SHARDCOORD_TOKEN");
  return env == nullptr ? "" : env;
}

void CoordinatorClient::SetDeadline(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  if (!options_.token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.token));
  }
}

template <typename Request, typename Response>
absl::StatusOr<Response> CoordinatorClient::Unary(grpc::Status (Stub::*method)(grpc::ClientContext*,
                                                                               const Request&,
                                                                               Response*),
                                                  const Request& request, absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + options_.retry_for;
  absl::Duration pause = options_.retry_backoff;
  absl::BitGen gen;
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    Response response;
    size_t index;
    std::shared_ptr<Stub> stub = Current(&index);
    const grpc::Status status = ((*stub).*method)(&context, request, &response);
    const bool redirected = Note(index, context, status);
    if (status.ok()) return response;
    absl::Status s = FromGrpcStatus(status);
    // CANCELLED: this client never cancels a unary call, so the server did. gRPC cancels the
    // calls a server had not handed to a handler yet when it shut down (grpc/grpc#41785): a
    // standby handing its port to the leader, a coordinator stopping. Retried as UNAVAILABLE
    // (a change keeps its request_id, so it still takes effect once).
    if (s.code() != absl::StatusCode::kUnavailable && s.code() != absl::StatusCode::kCancelled) {
      return s;
    }
    // A standby named the leader: go there at once (it counts as an attempt).
    if (redirected && absl::Now() < give_up) continue;
    // Backoff with jitter, so that clients a restart stopped together do not come back
    // together.
    const absl::Duration sleep = pause * absl::Uniform(gen, 0.5, 1.0);
    if (absl::Now() + sleep >= give_up) {
      if (attempt == 1) return s;
      return absl::Status(s.code(), absl::StrCat(s.message(), " (after ", attempt, " attempts in ",
                                                 absl::FormatDuration(options_.retry_for), ")"));
    }
    absl::SleepFor(sleep);
    pause = std::min(pause * 2, absl::Seconds(2));
  }
}

template <typename Request, typename Response>
absl::StatusOr<Response> CoordinatorClient::Mutate(
    grpc::Status (Stub::*method)(grpc::ClientContext*, const Request&, Response*), Request request,
    absl::Duration timeout) {
  if (request.request_id().empty()) request.set_request_id(NewRequestId());
  return Unary(method, request, timeout);
}

absl::StatusOr<std::vector<v1::WorkerInfo>> CoordinatorClient::ListWorkers() {
  absl::StatusOr<v1::ListWorkersResponse> r =
      Unary(&Stub::ListWorkers, v1::ListWorkersRequest(), options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return std::vector<v1::WorkerInfo>(r->workers().begin(), r->workers().end());
}

absl::StatusOr<v1::MeshInfo> CoordinatorClient::CreateMesh(const v1::CreateMeshRequest& request) {
  return Mutate(&Stub::CreateMesh, request, options_.rpc_timeout);
}

absl::StatusOr<v1::MeshInfo> CoordinatorClient::GetMesh(const std::string& name) {
  v1::GetMeshRequest request;
  request.set_name(name);
  return Unary(&Stub::GetMesh, request, options_.rpc_timeout);
}

absl::StatusOr<std::vector<v1::MeshInfo>> CoordinatorClient::ListMeshes() {
  absl::StatusOr<v1::ListMeshesResponse> r =
      Unary(&Stub::ListMeshes, v1::ListMeshesRequest(), options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return std::vector<v1::MeshInfo>(r->meshes().begin(), r->meshes().end());
}

absl::Status CoordinatorClient::DeleteMesh(const std::string& name) {
  v1::DeleteMeshRequest request;
  request.set_name(name);
  return Mutate(&Stub::DeleteMesh, request, options_.rpc_timeout).status();
}

absl::StatusOr<v1::TensorInfo> CoordinatorClient::CreateTensor(
    const v1::CreateTensorRequest& request) {
  return Mutate(&Stub::CreateTensor, request, options_.rpc_timeout);
}

absl::StatusOr<v1::TensorInfo> CoordinatorClient::GetTensor(const std::string& name) {
  v1::GetTensorRequest request;
  request.set_name(name);
  return Unary(&Stub::GetTensor, request, options_.rpc_timeout);
}

absl::StatusOr<std::vector<v1::TensorInfo>> CoordinatorClient::ListTensors() {
  absl::StatusOr<v1::ListTensorsResponse> r =
      Unary(&Stub::ListTensors, v1::ListTensorsRequest(), options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return std::vector<v1::TensorInfo>(r->tensors().begin(), r->tensors().end());
}

absl::Status CoordinatorClient::DeleteTensor(const std::string& name) {
  v1::DeleteTensorRequest request;
  request.set_name(name);
  return Mutate(&Stub::DeleteTensor, request, options_.rpc_timeout).status();
}

absl::StatusOr<v1::RedistributeResponse> CoordinatorClient::Redistribute(
    const v1::RedistributeRequest& request) {
  return Mutate(&Stub::Redistribute, request,
                request.wait() ? options_.data_timeout : options_.rpc_timeout);
}

absl::StatusOr<v1::RedistributeResponse> CoordinatorClient::Gather(
    const v1::GatherRequest& request) {
  return Mutate(&Stub::Gather, request,
                request.wait() ? options_.data_timeout : options_.rpc_timeout);
}

absl::StatusOr<v1::CopyResponse> CoordinatorClient::Copy(const v1::CopyRequest& request) {
  return Mutate(&Stub::Copy, request,
                request.wait() ? options_.data_timeout : options_.rpc_timeout);
}

absl::StatusOr<v1::CopyGroupResponse> CoordinatorClient::CopyGroup(
    const v1::CopyGroupRequest& request) {
  return Mutate(&Stub::CopyGroup, request,
                request.wait() ? options_.data_timeout : options_.rpc_timeout);
}

absl::StatusOr<v1::RedistributeGroupResponse> CoordinatorClient::RedistributeGroup(
    const v1::RedistributeGroupRequest& request) {
  return Mutate(&Stub::RedistributeGroup, request,
                request.wait() ? options_.data_timeout : options_.rpc_timeout);
}

absl::StatusOr<v1::SaveCheckpointResponse> CoordinatorClient::SaveCheckpoint(
    const v1::SaveCheckpointRequest& request) {
  return Mutate(&Stub::SaveCheckpoint, request, options_.data_timeout);
}

absl::StatusOr<v1::LoadCheckpointResponse> CoordinatorClient::LoadCheckpoint(
    const v1::LoadCheckpointRequest& request) {
  return Mutate(&Stub::LoadCheckpoint, request, options_.data_timeout);
}

absl::StatusOr<v1::InspectCheckpointResponse> CoordinatorClient::InspectCheckpoint(
    const std::string& dir) {
  v1::InspectCheckpointRequest request;
  request.set_dir(dir);
  return Unary(&Stub::InspectCheckpoint, request, options_.data_timeout);
}

absl::StatusOr<v1::CheckpointProgress> CoordinatorClient::GetCheckpointProgress(
    const std::string& request_id) {
  v1::GetCheckpointProgressRequest request;
  request.set_request_id(request_id);
  return Unary(&Stub::GetCheckpointProgress, request, options_.rpc_timeout);
}

absl::StatusOr<v1::RedistributeGroupResponse> CoordinatorClient::GatherGroup(
    const v1::GatherGroupRequest& request) {
  return Mutate(&Stub::GatherGroup, request,
                request.wait() ? options_.data_timeout : options_.rpc_timeout);
}

absl::StatusOr<v1::PlanTrace> CoordinatorClient::GetPlanTrace(const std::string& plan_id) {
  v1::GetPlanTraceRequest request;
  request.set_plan_id(plan_id);
  return Unary(&Stub::GetPlanTrace, request, options_.rpc_timeout);
}

absl::StatusOr<v1::ListPlansResponse> CoordinatorClient::ListPlans(int64_t limit) {
  v1::ListPlansRequest request;
  request.set_limit(limit);
  return Unary(&Stub::ListPlans, request, options_.rpc_timeout);
}

absl::StatusOr<v1::Plan> CoordinatorClient::PlanRedistribute(const v1::PlanRequest& request) {
  return Unary(&Stub::PlanRedistribute, request, options_.rpc_timeout);
}

absl::StatusOr<v1::PlanProgress> CoordinatorClient::WatchPlan(
    const std::string& plan_id, const std::function<void(const v1::PlanProgress&)>& on_progress) {
  grpc::ClientContext context;
  SetDeadline(&context, options_.data_timeout);
  v1::WatchPlanRequest request;
  request.set_plan_id(plan_id);
  size_t index;
  std::shared_ptr<Stub> stub = Current(&index);
  std::unique_ptr<grpc::ClientReader<v1::PlanProgress>> reader = stub->WatchPlan(&context, request);
  v1::PlanProgress last;
  bool any = false;
  v1::PlanProgress progress;
  while (reader->Read(&progress)) {
    if (on_progress) on_progress(progress);
    last = progress;
    any = true;
  }
  const grpc::Status status = reader->Finish();
  Note(index, context, status);
  if (!status.ok()) return FromGrpcStatus(status);
  if (!any) {
    return absl::InternalError(absl::StrCat("WatchPlan '", plan_id, "' ended without progress"));
  }
  return last;
}

absl::StatusOr<v1::TensorInfo> CoordinatorClient::Upload(const v1::TensorHeader& header,
                                                         absl::string_view data,
                                                         const ProgressCallback& progress) {
  v1::TensorHeader h = header;
  if (h.total_bytes() == 0) h.set_total_bytes(static_cast<int64_t>(data.size()));
  size_t offset = 0;
  absl::StatusOr<v1::TensorInfo> r = UploadFrom(
      h,
      [&](size_t max_bytes, std::string* piece) {
        const size_t n = std::min(max_bytes, data.size() - offset);
        piece->assign(data.data() + offset, n);
        offset += n;
        return absl::OkStatus();
      },
      progress);
  if (r.ok() && offset != data.size()) {
    return absl::InternalError(absl::StrCat("upload of '", header.name(), "': the server accepted ",
                                            offset, " of ", data.size(), " bytes and returned OK"));
  }
  return r;
}

absl::StatusOr<v1::TensorInfo> CoordinatorClient::UploadFrom(const v1::TensorHeader& header,
                                                             const ReadFn& read,
                                                             const ProgressCallback& progress) {
  grpc::ClientContext context;
  SetDeadline(&context, options_.data_timeout);
  v1::UploadResponse response;
  size_t index;
  std::shared_ptr<Stub> stub = Current(&index);
  std::unique_ptr<grpc::ClientWriter<v1::TensorData>> writer = stub->Upload(&context, &response);
  const int64_t total = header.total_bytes();

  // The header travels alone so that the server can reject it before any data arrives.
  v1::TensorData message;
  *message.mutable_header() = header;
  bool open = writer->Write(message);
  message.clear_header();
  int64_t sent = 0;
  absl::Status read_error;
  std::string piece;
  while (open) {
    read_error = read(options_.upload_chunk_bytes, &piece);
    if (!read_error.ok() || piece.empty()) break;
    message.set_data(std::move(piece));
    open = writer->Write(message);
    if (!open) break;  // The server ended the call; Finish says why.
    sent += static_cast<int64_t>(message.data().size());
    if (progress) progress(sent, total);
  }
  if (!read_error.ok()) {
    context.TryCancel();
    writer->Finish();
    return read_error;
  }
  if (open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  Note(index, context, status);
  if (!status.ok()) return FromGrpcStatus(status);
  if (sent != total) {
    return absl::InternalError(absl::StrCat("upload of '", header.name(), "': the server accepted ",
                                            sent, " of ", total, " bytes and returned OK"));
  }
  return response.tensor();
}

absl::StatusOr<v1::TensorHeader> CoordinatorClient::Download(const std::string& name,
                                                             std::string* data,
                                                             const ProgressCallback& progress) {
  data->clear();
  return DownloadTo(
      name,
      [&](const v1::TensorHeader& header) {
        // Reserve up front, but never trust a huge number before the data shows up.
        data->reserve(std::min<int64_t>(header.total_bytes(), int64_t{1} << 32));
        return absl::OkStatus();
      },
      [&](absl::string_view piece) {
        data->append(piece.data(), piece.size());
        return absl::OkStatus();
      },
      progress);
}

absl::StatusOr<v1::TensorHeader> CoordinatorClient::DownloadTo(const std::string& name,
                                                               const HeaderFn& on_header,
                                                               const DataFn& on_data,
                                                               const ProgressCallback& progress) {
  grpc::ClientContext context;
  SetDeadline(&context, options_.data_timeout);
  v1::DownloadRequest request;
  request.set_name(name);
  size_t index;
  std::shared_ptr<Stub> stub = Current(&index);
  std::unique_ptr<grpc::ClientReader<v1::TensorData>> reader = stub->Download(&context, request);
  v1::TensorHeader header;
  bool have_header = false;
  int64_t received = 0;
  absl::Status error;
  v1::TensorData message;
  while (reader->Read(&message)) {
    if (!have_header) {
      if (!message.has_header()) {
        error = absl::InternalError(
            absl::StrCat("download of '", name, "': the first message carries no header"));
        break;
      }
      header = message.header();
      have_header = true;
      if (header.total_bytes() < 0) {
        error = absl::InternalError(
            absl::StrCat("download of '", name, "': total_bytes is ", header.total_bytes()));
        break;
      }
      error = on_header(header);
      if (!error.ok()) break;
    }
    if (received + static_cast<int64_t>(message.data().size()) > header.total_bytes()) {
      error = absl::DataLossError(absl::StrCat("download of '", name, "': more than the ",
                                               header.total_bytes(), " bytes announced"));
      break;
    }
    if (message.data().empty()) continue;
    received += static_cast<int64_t>(message.data().size());
    error = on_data(message.data());
    if (!error.ok()) break;
    if (progress) progress(received, header.total_bytes());
  }
  if (!error.ok()) {
    context.TryCancel();
    reader->Finish();
    return error;
  }
  const grpc::Status status = reader->Finish();
  Note(index, context, status);
  if (!status.ok()) return FromGrpcStatus(status);
  if (!have_header) {
    return absl::InternalError(absl::StrCat("download of '", name, "': the stream was empty"));
  }
  if (received != header.total_bytes()) {
    return absl::DataLossError(absl::StrCat("download of '", name, "': got ", received, " of ",
                                            header.total_bytes(), " bytes"));
  }
  return header;
}

}  // namespace shardcoord
