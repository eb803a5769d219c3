#include "coordinator/grpc_worker_client.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace shardcoord {

namespace {

std::chrono::system_clock::time_point DeadlineIn(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

}  // namespace

GrpcWorkerClient::GrpcWorkerClient(GrpcWorkerClientOptions options)
    : options_(std::move(options)) {}

void GrpcWorkerClient::CancelAll() {
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  for (auto& [ctx, unused] : in_flight_) ctx->TryCancel();
}

GrpcWorkerClient::~GrpcWorkerClient() {
  CancelAll();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::map<grpc::ClientContext*, bool>* m) { return m->empty(); }, &in_flight_));
}

v1::Worker::Stub* GrpcWorkerClient::StubFor(const std::string& address) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<v1::Worker::Stub>& stub = stubs_[address];
  if (stub == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    stub = v1::Worker::NewStub(
        grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
  }
  return stub.get();
}

void GrpcWorkerClient::Begin(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  in_flight_[ctx] = true;
  if (shutting_down_) ctx->TryCancel();
}

void GrpcWorkerClient::End(grpc::ClientContext* ctx) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(ctx);
}

template <typename Req, typename Resp>
void GrpcWorkerClient::Unary(const WorkerEndpoint& worker, absl::Duration timeout,
                             const Req& request, StartFn<Req, Resp> start,
                             Callback<Resp> done) {
  struct Call {
    grpc::ClientContext ctx;
    Req request;
    Resp response;
  };
  auto* call = new Call;
  call->request = request;
  call->ctx.set_deadline(DeadlineIn(timeout));
  v1::Worker::Stub* stub = StubFor(worker.address);
  Begin(&call->ctx);
  start(stub->async(), &call->ctx, &call->request, &call->response,
        [this, call, done = std::move(done)](grpc::Status s) {
          if (s.ok()) {
            done(std::move(call->response));
          } else {
            done(FromGrpcStatus(s));
          }
          grpc::ClientContext* ctx = &call->ctx;
          End(ctx);
          delete call;
        });
}

void GrpcWorkerClient::Execute(const WorkerEndpoint& worker, const v1::PlanFragment& fragment,
                               StatusCallback done) {
  Unary<v1::PlanFragment, v1::ExecuteResponse>(
      worker, options_.rpc_timeout, fragment,
      [](class v1::Worker::Stub::async* a, grpc::ClientContext* c, const v1::PlanFragment* q,
         v1::ExecuteResponse* p, std::function<void(grpc::Status)> f) {
        a->Execute(c, q, p, std::move(f));
      },
      [done = std::move(done)](absl::StatusOr<v1::ExecuteResponse> r) { done(r.status()); });
}

void GrpcWorkerClient::FinishPlan(const WorkerEndpoint& worker,
                                  const v1::FinishPlanRequest& request, StatusCallback done) {
  Unary<v1::FinishPlanRequest, v1::FinishPlanResponse>(
      worker, options_.rpc_timeout, request,
      [](class v1::Worker::Stub::async* a, grpc::ClientContext* c, const v1::FinishPlanRequest* q,
         v1::FinishPlanResponse* p, std::function<void(grpc::Status)> f) {
        a->FinishPlan(c, q, p, std::move(f));
      },
      [done = std::move(done)](absl::StatusOr<v1::FinishPlanResponse> r) { done(r.status()); });
}

void GrpcWorkerClient::Fill(const WorkerEndpoint& worker, const v1::FillRequest& request,
                            Callback<v1::FillResponse> done) {
  Unary<v1::FillRequest, v1::FillResponse>(
      worker, options_.data_timeout, request,
      [](class v1::Worker::Stub::async* a, grpc::ClientContext* c, const v1::FillRequest* q,
         v1::FillResponse* p, std::function<void(grpc::Status)> f) {
        a->Fill(c, q, p, std::move(f));
      },
      std::move(done));
}

void GrpcWorkerClient::DropTensor(const WorkerEndpoint& worker,
                                  const v1::DropTensorRequest& request, StatusCallback done) {
  Unary<v1::DropTensorRequest, v1::DropTensorResponse>(
      worker, options_.rpc_timeout, request,
      [](class v1::Worker::Stub::async* a, grpc::ClientContext* c, const v1::DropTensorRequest* q,
         v1::DropTensorResponse* p, std::function<void(grpc::Status)> f) {
        a->DropTensor(c, q, p, std::move(f));
      },
      [done = std::move(done)](absl::StatusOr<v1::DropTensorResponse> r) { done(r.status()); });
}

// Collects a streamed box into one buffer.
class GrpcWorkerClient::ReadCall : public grpc::ClientReadReactor<v1::ChunkData> {
 public:
  ReadCall(GrpcWorkerClient* owner, const v1::ReadChunkRequest& request, absl::Duration timeout,
           Callback<std::string> done)
      : owner_(owner), request_(request), done_(std::move(done)) {
    ctx_.set_deadline(DeadlineIn(timeout));
  }

  void Start(v1::Worker::Stub* stub) {
    owner_->Begin(&ctx_);
    stub->async()->ReadChunk(&ctx_, &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // End of stream (or failure): OnDone follows.
    if (first_ && message_.total_bytes() > 0) {
      data_.reserve(static_cast<size_t>(message_.total_bytes()));
    }
    first_ = false;
    data_.append(message_.data());
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& s) override {
    if (s.ok()) {
      done_(std::move(data_));
    } else {
      done_(FromGrpcStatus(s));
    }
    GrpcWorkerClient* owner = owner_;
    grpc::ClientContext* ctx = &ctx_;
    owner->End(ctx);
    delete this;
  }

 private:
  GrpcWorkerClient* const owner_;
  grpc::ClientContext ctx_;
  v1::ReadChunkRequest request_;
  v1::ChunkData message_;
  std::string data_;
  bool first_ = true;
  Callback<std::string> done_;
};

void GrpcWorkerClient::ReadChunk(const WorkerEndpoint& worker,
                                 const v1::ReadChunkRequest& request,
                                 Callback<std::string> done) {
  auto* call = new ReadCall(this, request, options_.data_timeout, std::move(done));
  call->Start(StubFor(worker.address));
}

// Streams a header message, then the data in slices.
class GrpcWorkerClient::WriteCall : public grpc::ClientWriteReactor<v1::ChunkData> {
 public:
  WriteCall(GrpcWorkerClient* owner, const v1::ChunkData& header, std::string data,
            absl::Duration timeout, int64_t slice, Callback<v1::WriteChunkResponse> done)
      : owner_(owner), data_(std::move(data)), slice_(slice), done_(std::move(done)) {
    ctx_.set_deadline(DeadlineIn(timeout));
    message_ = header;
    message_.clear_data();
  }

  void Start(v1::Worker::Stub* stub) {
    owner_->Begin(&ctx_);
    stub->async()->WriteChunk(&ctx_, &response_, this);
    StartWrite(&message_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;  // The stream failed: OnDone follows with the status.
    if (offset_ < data_.size()) {
      const size_t n = std::min(data_.size() - offset_, static_cast<size_t>(slice_));
      message_.Clear();
      message_.set_data(data_.substr(offset_, n));
      offset_ += n;
      StartWrite(&message_);
    } else {
      StartWritesDone();
    }
  }

  void OnDone(const grpc::Status& s) override {
    if (s.ok()) {
      done_(std::move(response_));
    } else {
      done_(FromGrpcStatus(s));
    }
    GrpcWorkerClient* owner = owner_;
    grpc::ClientContext* ctx = &ctx_;
    owner->End(ctx);
    delete this;
  }

 private:
  GrpcWorkerClient* const owner_;
  grpc::ClientContext ctx_;
  v1::ChunkData message_;
  v1::WriteChunkResponse response_;
  std::string data_;
  size_t offset_ = 0;
  const int64_t slice_;
  Callback<v1::WriteChunkResponse> done_;
};

void GrpcWorkerClient::WriteChunk(const WorkerEndpoint& worker, const v1::ChunkData& header,
                                  std::string data, Callback<v1::WriteChunkResponse> done) {
  auto* call = new WriteCall(this, header, std::move(data), options_.data_timeout,
                             options_.chunk_message_bytes, std::move(done));
  call->Start(StubFor(worker.address));
}

}  // namespace shardcoord
