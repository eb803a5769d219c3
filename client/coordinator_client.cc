#include "client/coordinator_client.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
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

// The retry loop's clock and backoff: calls answered UNAVAILABLE are tried again until
// retry_for has passed since the first attempt, or since the last attempt of a stream that got
// further than any before it (Restart), pausing with jittered exponential backoff.
class RetryClock {
 public:
  explicit RetryClock(const CoordinatorClientOptions& options)
      : retry_for_(options.retry_for),
        first_pause_(options.retry_backoff),
        pause_(options.retry_backoff),
        give_up_(absl::Now() + options.retry_for) {}

  // The call made progress: the window and the backoff start again.
  void Restart() {
    give_up_ = absl::Now() + retry_for_;
    pause_ = first_pause_;
  }

  // After an attempt that failed with the transient `*s`: true to try again (after the
  // pause, or at once when a standby named the leader: `redirected`); false to give up with
  // `*s`, which then says how many attempts were made when more than one.
  bool Again(bool redirected, absl::Status* s) {
    ++attempts_;
    if (redirected && absl::Now() < give_up_) return true;
    // Jittered, so that clients a restart stopped together do not come back together.
    const absl::Duration sleep = pause_ * absl::Uniform(gen_, 0.5, 1.0);
    if (absl::Now() + sleep >= give_up_) {
      if (attempts_ > 1) {
        *s = absl::Status(s->code(),
                          absl::StrCat(s->message(), " (after ", attempts_, " attempts in ",
                                       absl::FormatDuration(retry_for_), ")"));
      }
      return false;
    }
    absl::SleepFor(sleep);
    pause_ = std::min(pause_ * 2, absl::Seconds(2));
    return true;
  }

 private:
  const absl::Duration retry_for_;
  const absl::Duration first_pause_;
  absl::Duration pause_;
  absl::Time give_up_;
  int attempts_ = 0;
  absl::BitGen gen_;
};

// Whether an attempt that ended with `s` is tried again. UNAVAILABLE: the coordinator is
// gone, restarting, a standby, or a worker failed. CANCELLED: this client cancels only for
// its own errors (returned before this), so the server did: gRPC cancels the calls a server
// had not handed to a handler yet when it shut down (grpc/grpc#41785), a standby handing its
// port to the leader, a coordinator stopping; retried as UNAVAILABLE (a change keeps its
// request_id, so it still takes effect once), but not once a response stream handed data
// to the caller (`moved`).
bool Transient(const absl::Status& s, bool moved) {
  if (s.code() == absl::StatusCode::kUnavailable) return true;
  return s.code() == absl::StatusCode::kCancelled && !moved;
}

bool Terminal(const v1::PlanProgress& p) {
  return p.state() == v1::COMMITTED || p.state() == v1::ABORTED;
}

// Whether a download may resume on a stream with header `now` after `delivered` bytes of the
// stream with header `first` were handed over: the same tensor, shape, dtype and size, and
// (once bytes were delivered) the same version. ABORTED otherwise.
absl::Status CheckResumable(const std::string& name, const v1::TensorHeader& first,
                            const v1::TensorHeader& now, int64_t delivered) {
  const bool same_tensor = now.name() == first.name() && now.dtype() == first.dtype() &&
                           now.total_bytes() == first.total_bytes() &&
                           std::equal(now.shape().begin(), now.shape().end(), first.shape().begin(),
                                      first.shape().end());
  if (!same_tensor) {
    return absl::AbortedError(absl::StrCat("tensor '", name,
                                           "' changed shape or dtype during the download "
                                           "(resumed after a failover): retry"));
  }
  if (delivered == 0) return absl::OkStatus();
  if (first.version() <= 0 || now.version() <= 0) {
    return absl::AbortedError(absl::StrCat("download of '", name,
                                           "' broke and cannot resume: the coordinator does not "
                                           "say which version it sends: retry"));
  }
  if (now.version() != first.version()) {
    return absl::AbortedError(absl::StrCat("tensor '", name, "' changed from version ",
                                           first.version(), " to ", now.version(),
                                           " during the download (resumed after a failover): "
                                           "retry"));
  }
  return absl::OkStatus();
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
  RetryClock clock(options_);
  for (;;) {
    grpc::ClientContext context;
    SetDeadline(&context, timeout);
    Response response;
    size_t index;
    std::shared_ptr<Stub> stub = Current(&index);
    const grpc::Status status = ((*stub).*method)(&context, request, &response);
    const bool redirected = Note(index, context, status);
    if (status.ok()) return response;
    absl::Status s = FromGrpcStatus(status);
    if (!Transient(s, /*moved=*/false) || !clock.Again(redirected, &s)) return s;
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
  std::vector<v1::WorkerInfo> out;
  v1::ListWorkersRequest request;
  for (;;) {
    absl::StatusOr<v1::ListWorkersResponse> r =
        Unary(&Stub::ListWorkers, request, options_.rpc_timeout);
    if (!r.ok()) return r.status();
    for (v1::WorkerInfo& w : *r->mutable_workers()) out.push_back(std::move(w));
    if (r->next_page_token().empty()) return out;
    request.set_page_token(r->next_page_token());
  }
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

absl::StatusOr<std::vector<v1::TensorInfo>> CoordinatorClient::ListTensors(
    const std::string& prefix) {
  std::vector<v1::TensorInfo> out;
  v1::ListTensorsRequest request;
  request.set_prefix(prefix);
  for (;;) {
    absl::StatusOr<v1::ListTensorsResponse> r =
        Unary(&Stub::ListTensors, request, options_.rpc_timeout);
    if (!r.ok()) return r.status();
    for (v1::TensorInfo& t : *r->mutable_tensors()) out.push_back(std::move(t));
    if (r->next_page_token().empty()) return out;
    request.set_page_token(r->next_page_token());
  }
}

absl::StatusOr<v1::CreateTensorsResponse> CoordinatorClient::CreateTensors(
    const v1::CreateTensorsRequest& request) {
  return Mutate(&Stub::CreateTensors, request, options_.data_timeout);
}

absl::StatusOr<int64_t> CoordinatorClient::DeleteTensors(const std::vector<std::string>& names,
                                                         const std::string& prefix) {
  v1::DeleteTensorsRequest request;
  for (const std::string& n : names) request.add_names(n);
  request.set_prefix(prefix);
  absl::StatusOr<v1::DeleteTensorsResponse> r =
      Mutate(&Stub::DeleteTensors, request, options_.rpc_timeout);
  if (!r.ok()) return r.status();
  return r->deleted();
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

absl::StatusOr<v1::TransferInfo> CoordinatorClient::CreateTransfer(
    const v1::CreateTransferRequest& request) {
  return Mutate(&Stub::CreateTransfer, request, options_.data_timeout);
}

absl::StatusOr<v1::RunTransferResponse> CoordinatorClient::RunTransfer(
    const v1::RunTransferRequest& request) {
  return Mutate(&Stub::RunTransfer, request,
                request.wait() ? options_.data_timeout : options_.rpc_timeout);
}

absl::StatusOr<v1::TransferInfo> CoordinatorClient::GetTransfer(const std::string& name,
                                                                bool copies) {
  v1::GetTransferRequest request;
  request.set_name(name);
  request.set_copies(copies);
  return Unary(&Stub::GetTransfer, request, options_.rpc_timeout);
}

absl::StatusOr<std::vector<v1::TransferInfo>> CoordinatorClient::ListTransfers() {
  std::vector<v1::TransferInfo> out;
  v1::ListTransfersRequest request;
  for (;;) {
    absl::StatusOr<v1::ListTransfersResponse> r =
        Unary(&Stub::ListTransfers, request, options_.rpc_timeout);
    if (!r.ok()) return r.status();
    for (v1::TransferInfo& t : *r->mutable_transfers()) out.push_back(std::move(t));
    if (r->next_page_token().empty()) return out;
    request.set_page_token(r->next_page_token());
  }
}

absl::Status CoordinatorClient::DeleteTransfer(const std::string& name) {
  v1::DeleteTransferRequest request;
  request.set_name(name);
  return Mutate(&Stub::DeleteTransfer, request, options_.rpc_timeout).status();
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
  v1::WatchPlanRequest request;
  request.set_plan_id(plan_id);
  RetryClock clock(options_);
  v1::PlanProgress last;
  bool any = false;
  for (;;) {
    grpc::ClientContext context;
    SetDeadline(&context, options_.data_timeout);
    size_t index;
    std::shared_ptr<Stub> stub = Current(&index);
    std::unique_ptr<grpc::ClientReader<v1::PlanProgress>> reader =
        stub->WatchPlan(&context, request);
    bool moved = false;  // A message arrived on this attempt.
    bool news = false;   // One that said something the last did not.
    v1::PlanProgress progress;
    while (reader->Read(&progress)) {
      moved = true;
      news = news || !any || progress.state() != last.state() ||
             progress.bytes_done() != last.bytes_done();
      if (on_progress) on_progress(progress);
      last = progress;
      any = true;
    }
    const grpc::Status status = reader->Finish();
    const bool redirected = Note(index, context, status);
    if (status.ok()) {
      if (!any) {
        return absl::InternalError(
            absl::StrCat("WatchPlan '", plan_id, "' ended without progress"));
      }
      return last;
    }
    absl::Status s = FromGrpcStatus(status);
    // The plan's end arrived before the stream broke: that is all a watch is for.
    if (any && Terminal(last) && s.code() == absl::StatusCode::kUnavailable) return last;
    if (!Transient(s, moved)) return s;
    if (news) clock.Restart();
    if (!clock.Again(redirected, &s)) return s;
  }
}

absl::StatusOr<v1::TensorInfo> CoordinatorClient::Upload(const v1::TensorHeader& header,
                                                         absl::string_view data,
                                                         const ProgressCallback& progress) {
  v1::TensorHeader h = header;
  if (h.total_bytes() == 0) h.set_total_bytes(static_cast<int64_t>(data.size()));
  return UploadFrom(
      h,
      [data]() -> absl::StatusOr<ReadFn> {
        auto offset = std::make_shared<size_t>(0);
        return ReadFn([data, offset](size_t max_bytes, std::string* piece) {
          const size_t n = std::min(max_bytes, data.size() - *offset);
          piece->assign(data.data() + *offset, n);
          *offset += n;
          return absl::OkStatus();
        });
      },
      progress);
}

absl::StatusOr<v1::TensorInfo> CoordinatorClient::UploadFrom(const v1::TensorHeader& header,
                                                             const OpenFn& open,
                                                             const ProgressCallback& progress) {
  return UploadAttempts(header, open, /*restartable=*/true, progress);
}

absl::StatusOr<v1::TensorInfo> CoordinatorClient::UploadFrom(const v1::TensorHeader& header,
                                                             const ReadFn& read,
                                                             const ProgressCallback& progress) {
  return UploadAttempts(
      header, [&read]() -> absl::StatusOr<ReadFn> { return read; }, /*restartable=*/false,
      progress);
}

absl::StatusOr<v1::TensorInfo> CoordinatorClient::UploadAttempts(const v1::TensorHeader& header,
                                                                 const OpenFn& open,
                                                                 bool restartable,
                                                                 const ProgressCallback& progress) {
  v1::TensorHeader h = header;
  // One id for every attempt: a retry of an upload that committed answers its outcome.
  if (h.request_id().empty()) h.set_request_id(NewRequestId());
  const int64_t total = h.total_bytes();
  RetryClock clock(options_);
  int64_t furthest = 0;  // The most bytes any attempt got through.
  for (;;) {
    absl::StatusOr<ReadFn> read = open();
    if (!read.ok()) return read.status();
    grpc::ClientContext context;
    SetDeadline(&context, options_.data_timeout);
    v1::UploadResponse response;
    size_t index;
    std::shared_ptr<Stub> stub = Current(&index);
    std::unique_ptr<grpc::ClientWriter<v1::TensorData>> writer = stub->Upload(&context, &response);

    // The header travels alone so that the server can reject it before any data arrives.
    v1::TensorData message;
    *message.mutable_header() = h;
    bool open_stream = writer->Write(message);
    message.clear_header();
    int64_t sent = 0;
    bool read_any = false;  // Data was taken from the source on this attempt.
    absl::Status read_error;
    std::string piece;
    while (open_stream) {
      read_error = (*read)(options_.upload_chunk_bytes, &piece);
      if (!read_error.ok() || piece.empty()) break;
      read_any = true;
      message.set_data(std::move(piece));
      open_stream = writer->Write(message);
      if (!open_stream) break;  // The server ended the call; Finish says why.
      sent += static_cast<int64_t>(message.data().size());
      if (progress) progress(sent, total);
    }
    if (!read_error.ok()) {
      context.TryCancel();
      writer->Finish();
      return read_error;
    }
    if (open_stream) writer->WritesDone();
    const grpc::Status status = writer->Finish();
    const bool redirected = Note(index, context, status);
    if (status.ok()) {
      // A replay took none of this attempt's data: the first attempt's did.
      if (!response.replayed() && sent != total) {
        return absl::InternalError(absl::StrCat("upload of '", h.name(), "': the server accepted ",
                                                sent, " of ", total, " bytes and returned OK"));
      }
      return response.tensor();
    }
    absl::Status s = FromGrpcStatus(status);
    // As a unary change, not as a download: the caller has consumed nothing partial, the
    // upload commits whole or not at all and its request_id makes a retry answer a commit
    // it missed. So CANCELLED is retried even after data was sent: a standby that took the
    // stream and handed its port to the new leader cancels it (grpc/grpc#41785).
    if (!Transient(s, /*moved=*/false)) return s;
    if (read_any && !restartable) {
      return absl::Status(s.code(), absl::StrCat(s.message(),
                                                 " (not retried: the upload's data source "
                                                 "cannot be read again)"));
    }
    if (sent > furthest) {
      furthest = sent;
      clock.Restart();
    }
    if (!clock.Again(redirected, &s)) return s;
  }
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
  v1::DownloadRequest request;
  request.set_name(name);
  RetryClock clock(options_);
  std::optional<v1::TensorHeader> first;  // The header handed to on_header.
  int64_t delivered = 0;                  // Bytes handed to on_data, over all attempts.
  for (;;) {
    grpc::ClientContext context;
    SetDeadline(&context, options_.data_timeout);
    size_t index;
    std::shared_ptr<Stub> stub = Current(&index);
    std::unique_ptr<grpc::ClientReader<v1::TensorData>> reader = stub->Download(&context, request);
    const int64_t delivered_before = delivered;
    v1::TensorHeader header;
    bool have_header = false;
    int64_t received = 0;  // This stream's bytes; its first `delivered` were delivered before.
    absl::Status error;    // The caller's or the stream's own: never retried.
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
        if (!first.has_value()) {
          first = header;
          error = on_header(header);
        } else {
          error = CheckResumable(name, *first, header, delivered);
        }
        if (!error.ok()) break;
      }
      const absl::string_view data = message.data();
      if (received + static_cast<int64_t>(data.size()) > header.total_bytes()) {
        error = absl::DataLossError(absl::StrCat("download of '", name, "': more than the ",
                                                 header.total_bytes(), " bytes announced"));
        break;
      }
      const int64_t start = received;
      received += static_cast<int64_t>(data.size());
      // Nothing new (an empty message, or bytes an earlier attempt delivered); else the bytes
      // from `delivered` on (start <= delivered: received never passes delivered unseen).
      if (received <= delivered) continue;
      const absl::string_view fresh = data.substr(static_cast<size_t>(delivered - start));
      delivered = received;
      error = on_data(fresh);
      if (!error.ok()) break;
      if (progress) progress(delivered, header.total_bytes());
    }
    if (!error.ok()) {
      context.TryCancel();
      reader->Finish();
      return error;
    }
    const grpc::Status status = reader->Finish();
    const bool redirected = Note(index, context, status);
    if (status.ok()) {
      if (!have_header) {
        return absl::InternalError(absl::StrCat("download of '", name, "': the stream was empty"));
      }
      if (received != header.total_bytes()) {
        return absl::DataLossError(absl::StrCat("download of '", name, "': got ", received, " of ",
                                                header.total_bytes(), " bytes"));
      }
      return header;
    }
    absl::Status s = FromGrpcStatus(status);
    if (!Transient(s, have_header)) return s;
    if (delivered > delivered_before) clock.Restart();
    if (!clock.Again(redirected, &s)) return s;
  }
}

}  // namespace shardcoord
