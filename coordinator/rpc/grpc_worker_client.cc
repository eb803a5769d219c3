#include "coordinator/rpc/grpc_worker_client.h"

#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_credentials.h"
#include "proto/rpc_metrics.h"
#include "proto/shardcoord.grpc.pb.h"

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

GrpcWorkerClient::Channel& GrpcWorkerClient::ChannelFor(const WorkerEndpoint& worker) {
  Channel& c = channels_[{worker.address, worker.name}];
  if (c.channel == nullptr) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    // With TLS the worker must present the certificate of the name it registered.
    ExpectServerName(options_.tls, worker.name, &args);
    std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> counting;
    if (options_.message_bytes != nullptr) {
      // The page stub's answers are protobuf messages too, as the interceptor reads them.
      counting.push_back(MakeRpcBytesClientInterceptor(
          RpcMethods::Of({v1::Worker::service_full_name()}), options_.message_bytes));
    }
    c.channel = grpc::experimental::CreateCustomChannelWithInterceptors(
        worker.address, MakeChannelCredentials(options_.tls), args, std::move(counting));
    c.stub = v1::Worker::NewStub(c.channel);
    c.pages = std::make_unique<PageStub>(c.channel);
  }
  return c;
}

v1::Worker::Stub* GrpcWorkerClient::StubFor(const WorkerEndpoint& worker) {
  absl::MutexLock lock(&mu_);
  return ChannelFor(worker).stub.get();
}

GrpcWorkerClient::PageStub* GrpcWorkerClient::PageStubFor(const WorkerEndpoint& worker) {
  absl::MutexLock lock(&mu_);
  return ChannelFor(worker).pages.get();
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

template <typename Call, typename Resp>
void GrpcWorkerClient::Complete(Call* call, grpc::ClientContext* ctx, const grpc::Status& s,
                                Resp& response, const Callback<Resp>& done) {
  if (s.ok()) {
    done(std::move(response));
  } else {
    done(FromGrpcStatus(s));
  }
  End(ctx);
  delete call;
}

template <typename Resp>
GrpcWorkerClient::Callback<Resp> GrpcWorkerClient::StatusOnly(StatusCallback done) {
  return [done = std::move(done)](absl::StatusOr<Resp> r) { done(r.status()); };
}

template <typename Req, typename Resp>
void GrpcWorkerClient::Unary(const WorkerEndpoint& worker, absl::Duration timeout, Req request,
                             AsyncMethod<Req, Resp> method, Callback<Resp> done) {
  struct Call {
    grpc::ClientContext ctx;
    Req request;
    Resp response;
  };
  auto* call = new Call;
  call->request = std::move(request);
  call->ctx.set_deadline(DeadlineIn(timeout));
  v1::Worker::Stub* stub = StubFor(worker);
  Begin(&call->ctx);
  (stub->async()->*method)(&call->ctx, &call->request, &call->response,
                           [this, call, done = std::move(done)](grpc::Status s) {
                             Complete(call, &call->ctx, s, call->response, done);
                           });
}

void GrpcWorkerClient::Execute(const WorkerEndpoint& worker, v1::PlanFragment fragment,
                               StatusCallback done) {
  Unary<v1::PlanFragment, v1::ExecuteResponse>(worker, options_.rpc_timeout, std::move(fragment),
                                               &v1::Worker::Stub::async::Execute,
                                               StatusOnly<v1::ExecuteResponse>(std::move(done)));
}

void GrpcWorkerClient::ReadBoxes(const WorkerEndpoint& worker, const v1::ReadBoxesRequest& request,
                                 Callback<v1::ReadBoxesResponse> done) {
  Unary<v1::ReadBoxesRequest, v1::ReadBoxesResponse>(
      worker, options_.rpc_timeout, request, &v1::Worker::Stub::async::ReadBoxes, std::move(done));
}

void GrpcWorkerClient::WriteBuffer(const WorkerEndpoint& worker, v1::ChunkData message,
                                   Callback<v1::WriteChunkResponse> done) {
  Unary<v1::ChunkData, v1::WriteChunkResponse>(worker, options_.rpc_timeout, std::move(message),
                                               &v1::Worker::Stub::async::WriteBuffer,
                                               std::move(done));
}

void GrpcWorkerClient::FinishPlan(const WorkerEndpoint& worker, v1::FinishPlanRequest request,
                                  StatusCallback done) {
  Unary<v1::FinishPlanRequest, v1::FinishPlanResponse>(
      worker, options_.rpc_timeout, std::move(request), &v1::Worker::Stub::async::FinishPlan,
      StatusOnly<v1::FinishPlanResponse>(std::move(done)));
}

void GrpcWorkerClient::Fill(const WorkerEndpoint& worker, const v1::FillRequest& request,
                            Callback<v1::FillResponse> done) {
  Unary<v1::FillRequest, v1::FillResponse>(worker, options_.data_timeout, request,
                                           &v1::Worker::Stub::async::Fill, std::move(done));
}

void GrpcWorkerClient::FillMany(const WorkerEndpoint& worker, const v1::FillManyRequest& request,
                                Callback<v1::FillManyResponse> done) {
  Unary<v1::FillManyRequest, v1::FillManyResponse>(
      worker, options_.data_timeout, request, &v1::Worker::Stub::async::FillMany, std::move(done));
}

void GrpcWorkerClient::DropTensor(const WorkerEndpoint& worker,
                                  const v1::DropTensorRequest& request, StatusCallback done) {
  Unary<v1::DropTensorRequest, v1::DropTensorResponse>(
      worker, options_.rpc_timeout, request, &v1::Worker::Stub::async::DropTensor,
      StatusOnly<v1::DropTensorResponse>(std::move(done)));
}

void GrpcWorkerClient::WriteCheckpoint(const WorkerEndpoint& worker,
                                       const v1::WriteCheckpointRequest& request,
                                       Callback<v1::WriteCheckpointResponse> done) {
  Unary<v1::WriteCheckpointRequest, v1::WriteCheckpointResponse>(
      worker, options_.data_timeout, request, &v1::Worker::Stub::async::WriteCheckpoint,
      std::move(done));
}

void GrpcWorkerClient::ReadCheckpoint(const WorkerEndpoint& worker,
                                      const v1::ReadCheckpointRequest& request,
                                      Callback<v1::ReadCheckpointResponse> done) {
  Unary<v1::ReadCheckpointRequest, v1::ReadCheckpointResponse>(
      worker, options_.data_timeout, request, &v1::Worker::Stub::async::ReadCheckpoint,
      std::move(done));
}

void GrpcWorkerClient::ReadCheckpointIndex(const WorkerEndpoint& worker,
                                           const v1::ReadCheckpointIndexRequest& request,
                                           Callback<v1::ReadCheckpointIndexResponse> done) {
  Unary<v1::ReadCheckpointIndexRequest, v1::ReadCheckpointIndexResponse>(
      worker, options_.data_timeout, request, &v1::Worker::Stub::async::ReadCheckpointIndex,
      std::move(done));
}

void GrpcWorkerClient::CheckpointDir(const WorkerEndpoint& worker,
                                     const v1::CheckpointDirRequest& request, StatusCallback done) {
  Unary<v1::CheckpointDirRequest, v1::CheckpointDirResponse>(
      worker, options_.data_timeout, request, &v1::Worker::Stub::async::CheckpointDir,
      StatusOnly<v1::CheckpointDirResponse>(std::move(done)));
}

std::shared_ptr<const grpc::ByteBuffer> GrpcWorkerClient::Serialized(
    const std::shared_ptr<const v1::PrepareTransferRequest>& page) {
  {
    absl::MutexLock lock(&mu_);
    if (last_page_.lock() == page && last_page_bytes_ != nullptr) return last_page_bytes_;
  }
  // Outside the lock: a page is about 1 MiB. Two threads may both serialize one page; the
  // second just replaces the first's.
  const grpc::Slice slice(page->SerializeAsString());
  auto bytes = std::make_shared<const grpc::ByteBuffer>(&slice, 1);
  absl::MutexLock lock(&mu_);
  last_page_ = page;
  last_page_bytes_ = bytes;
  return bytes;
}

void GrpcWorkerClient::PrepareTransfer(const WorkerEndpoint& worker,
                                       std::shared_ptr<const v1::PrepareTransferRequest> request,
                                       Callback<v1::PrepareTransferResponse> done) {
  struct Call {
    grpc::ClientContext ctx;
    std::shared_ptr<const grpc::ByteBuffer> request;  // Shared by every worker's call.
    v1::PrepareTransferResponse response;
  };
  auto* call = new Call;
  call->request = Serialized(request);
  call->ctx.set_deadline(DeadlineIn(options_.data_timeout));
  PageStub* stub = PageStubFor(worker);
  Begin(&call->ctx);
  stub->UnaryCall(&call->ctx, "/shardcoord.v1.Worker/PrepareTransfer", grpc::StubOptions(),
                  call->request.get(), &call->response,
                  [this, call, done = std::move(done)](grpc::Status s) {
                    Complete(call, &call->ctx, s, call->response, done);
                  });
}

void GrpcWorkerClient::RunTransfer(const WorkerEndpoint& worker,
                                   const v1::RunTransferWorkerRequest& request,
                                   absl::Duration timeout,
                                   Callback<v1::RunTransferWorkerResponse> done) {
  Unary<v1::RunTransferWorkerRequest, v1::RunTransferWorkerResponse>(
      worker, timeout, request, &v1::Worker::Stub::async::RunTransfer, std::move(done));
}

void GrpcWorkerClient::DropTransfer(const WorkerEndpoint& worker,
                                    const v1::DropTransferRequest& request, StatusCallback done) {
  Unary<v1::DropTransferRequest, v1::DropTransferResponse>(
      worker, options_.rpc_timeout, request, &v1::Worker::Stub::async::DropTransfer,
      StatusOnly<v1::DropTransferResponse>(std::move(done)));
}

void GrpcWorkerClient::BlockQuantize(const WorkerEndpoint& worker,
                                     const v1::BlockQuantizeRequest& request,
                                     Callback<v1::BlockQuantizeResponse> done) {
  // Reads and writes whole buffers on the worker: a data call's deadline.
  Unary<v1::BlockQuantizeRequest, v1::BlockQuantizeResponse>(
      worker, options_.data_timeout, request, &v1::Worker::Stub::async::BlockQuantize,
      std::move(done));
}

void GrpcWorkerClient::ComposeBoxes(const WorkerEndpoint& worker,
                                    const v1::ComposeBoxesRequest& request,
                                    Callback<v1::ComposeBoxesResponse> done) {
  // Reads and writes whole buffers on the worker: a data call's deadline.
  Unary<v1::ComposeBoxesRequest, v1::ComposeBoxesResponse>(worker, options_.data_timeout, request,
                                                           &v1::Worker::Stub::async::ComposeBoxes,
                                                           std::move(done));
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

  void OnDone(const grpc::Status& s) override { owner_->Complete(this, &ctx_, s, data_, done_); }

 private:
  GrpcWorkerClient* const owner_;
  grpc::ClientContext ctx_;
  v1::ReadChunkRequest request_;
  v1::ChunkData message_;
  std::string data_;
  bool first_ = true;
  Callback<std::string> done_;
};

void GrpcWorkerClient::ReadChunk(const WorkerEndpoint& worker, const v1::ReadChunkRequest& request,
                                 Callback<std::string> done) {
  auto* call = new ReadCall(this, request, options_.data_timeout, std::move(done));
  call->Start(StubFor(worker));
}

// A WriteChunk stream fed piece by piece. The reactor keeps a gRPC hold until the caller
// finishes or cancels (or a write fails), so OnDone cannot run, and delete it, while a
// caller might still start an operation; only the holder of the write claim (`writing`)
// starts operations or removes the hold. What the caller's handle touches lives in State.
class GrpcWorkerClient::StreamCall : public grpc::ClientWriteReactor<v1::ChunkData> {
 public:
  using WriteDone = std::function<void(absl::Status)>;
  using FinishDone = std::function<void(absl::StatusOr<v1::WriteChunkResponse>)>;

  struct State {
    absl::Mutex mu;
    StreamCall* call ABSL_GUARDED_BY(mu) = nullptr;  // Null once OnDone ran.
    // Writes not yet completed; the front one is in flight while `writing`.
    std::deque<std::pair<std::string, WriteDone>> queue ABSL_GUARDED_BY(mu);
    bool writing ABSL_GUARDED_BY(mu) = true;  // The header goes first.
    bool held ABSL_GUARDED_BY(mu) = true;
    bool broken ABSL_GUARDED_BY(mu) = false;  // A write failed or the caller cancelled.
    bool finish_requested ABSL_GUARDED_BY(mu) = false;
    FinishDone finish_done ABSL_GUARDED_BY(mu);
    bool ended ABSL_GUARDED_BY(mu) = false;
    absl::Status end_status ABSL_GUARDED_BY(mu);
  };

  StreamCall(GrpcWorkerClient* owner, const v1::ChunkData& header, absl::Duration timeout,
             int64_t slice, std::shared_ptr<State> state)
      : owner_(owner), slice_(slice), state_(std::move(state)) {
    ctx_.set_deadline(DeadlineIn(timeout));
    message_ = header;
    message_.clear_data();
    absl::MutexLock lock(&state_->mu);
    state_->call = this;
  }

  void Start(v1::Worker::Stub* stub) {
    owner_->Begin(&ctx_);
    stub->async()->WriteChunk(&ctx_, &response_, this);
    AddHold();
    StartWrite(&message_);
    StartCall();
  }

  // Called by the write claim holder: the next slice of the front write.
  void WriteNext(const std::string& data) {
    const size_t n = std::min(data.size() - offset_, static_cast<size_t>(slice_));
    message_.Clear();
    message_.set_data(data.data() + offset_, n);
    offset_ += n;
    StartWrite(&message_);
  }

  // Under the state's mutex, so the call cannot end (and be deleted) meanwhile.
  static void CancelLocked(State& state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu) {
    if (state.call != nullptr) state.call->ctx_.TryCancel();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      {
        absl::MutexLock lock(&state_->mu);
        state_->broken = true;
        state_->writing = false;
        state_->held = false;
      }
      RemoveHold();  // OnDone follows with the status and fails what is queued.
      return;
    }
    WriteDone completed;
    const std::string* next = nullptr;
    bool writes_done = false;
    bool release = false;  // This call ends the claim of a broken stream: drop the hold.
    {
      absl::MutexLock lock(&state_->mu);
      if (!header_sent_) {
        header_sent_ = true;
      } else if (offset_ >= state_->queue.front().first.size()) {
        completed = std::move(state_->queue.front().second);
        state_->queue.pop_front();
        offset_ = 0;
      }
      if (state_->broken) {
        state_->writing = false;
        state_->held = false;
        release = true;
      } else if (!state_->queue.empty()) {
        next = &state_->queue.front().first;  // Stays put: only this claim pops it.
      } else if (state_->finish_requested) {
        writes_done = true;
        state_->held = false;
      } else {
        state_->writing = false;
      }
    }
    if (completed) completed(absl::OkStatus());
    if (next != nullptr) return WriteNext(*next);
    if (writes_done) {
      StartWritesDone();
      RemoveHold();
      return;
    }
    // Exactly one place drops the hold: here (a cancel that came during the write), the
    // failed-write branch above, Finish or OnWriteDone's WritesDone (held cleared under the
    // lock by whoever drops it), or Cancel while no write is in flight.
    if (release) RemoveHold();
  }

  void OnDone(const grpc::Status& s) override {
    std::deque<std::pair<std::string, WriteDone>> queue;
    FinishDone finish;
    bool broken = false;
    const absl::Status status = s.ok() ? absl::OkStatus() : FromGrpcStatus(s);
    {
      absl::MutexLock lock(&state_->mu);
      state_->call = nullptr;
      state_->ended = true;
      state_->end_status =
          status.ok() ? absl::CancelledError("WriteChunk stream already ended") : status;
      queue.swap(state_->queue);
      if (state_->finish_requested) finish = std::move(state_->finish_done);
      broken = state_->broken;
    }
    const absl::Status failed =
        status.ok() ? absl::UnavailableError("WriteChunk stream ended early") : status;
    for (auto& [unused, done] : queue) done(failed);
    if (finish) {
      if (status.ok() && !broken) {
        finish(std::move(response_));
      } else {
        finish(failed);
      }
    }
    GrpcWorkerClient* owner = owner_;
    grpc::ClientContext* ctx = &ctx_;
    owner->End(ctx);
    delete this;
  }

 private:
  GrpcWorkerClient* const owner_;
  const int64_t slice_;
  std::shared_ptr<State> state_;
  grpc::ClientContext ctx_;
  v1::ChunkData message_;
  v1::WriteChunkResponse response_;
  // Owned by the write claim holder.
  bool header_sent_ = false;
  size_t offset_ = 0;
};

class GrpcWorkerClient::StreamHandle : public ChunkWriteStream {
 public:
  explicit StreamHandle(std::shared_ptr<StreamCall::State> state) : state_(std::move(state)) {}
  ~StreamHandle() override { Cancel(); }

  void Write(std::string data, std::function<void(absl::Status)> done) override {
    StreamCall* start = nullptr;
    const std::string* front = nullptr;
    absl::Status now;
    bool complete_now = false;
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->ended) {
        now = state_->end_status;
        complete_now = true;
      } else if (data.empty() && !state_->broken) {
        complete_now = true;
      } else {
        // A broken stream keeps it queued: OnDone fails it with the stream's status.
        state_->queue.emplace_back(std::move(data), std::move(done));
        if (!state_->writing && !state_->broken) {
          state_->writing = true;
          start = state_->call;
          front = &state_->queue.front().first;
        }
      }
    }
    if (complete_now) return done(now);
    if (start != nullptr) start->WriteNext(*front);
  }

  void Finish(std::function<void(absl::StatusOr<v1::WriteChunkResponse>)> done) override {
    StreamCall* start = nullptr;
    absl::Status now;
    {
      absl::MutexLock lock(&state_->mu);
      if (state_->ended || state_->finish_requested) {
        now = state_->ended ? state_->end_status
                            : absl::FailedPreconditionError("WriteChunk stream finished twice");
      } else {
        state_->finish_requested = true;
        state_->finish_done = std::move(done);
        if (!state_->writing && !state_->broken) {
          state_->writing = true;
          state_->held = false;
          start = state_->call;
        }
      }
    }
    if (!now.ok()) return done(now);
    if (start != nullptr) {
      start->StartWritesDone();
      start->RemoveHold();
    }
  }

  void Cancel() override {
    StreamCall* release = nullptr;
    {
      absl::MutexLock lock(&state_->mu);
      // After Finish the stream ends on its own (the handle's destructor cancels).
      if (state_->ended || state_->broken || state_->finish_requested) return;
      state_->broken = true;
      StreamCall::CancelLocked(*state_);
      if (state_->held && !state_->writing) {
        state_->held = false;
        release = state_->call;
      }
    }
    // With a write in flight, it fails and its OnWriteDone removes the hold.
    if (release != nullptr) release->RemoveHold();
  }

 private:
  std::shared_ptr<StreamCall::State> state_;
};

std::shared_ptr<ChunkWriteStream> GrpcWorkerClient::OpenWriteChunk(const WorkerEndpoint& worker,
                                                                   const v1::ChunkData& header) {
  auto state = std::make_shared<StreamCall::State>();
  auto* call =
      new StreamCall(this, header, options_.data_timeout, options_.chunk_message_bytes, state);
  call->Start(StubFor(worker));
  return std::make_shared<StreamHandle>(std::move(state));
}

// The whole buffer as one piece of a stream. The Write's own result is left out: a failed
// write fails the stream, which Finish reports. The finish callback holds the handle (its
// destructor would cancel) until the stream has ended.
void GrpcWorkerClient::WriteChunk(const WorkerEndpoint& worker, const v1::ChunkData& header,
                                  std::string data, Callback<v1::WriteChunkResponse> done) {
  std::shared_ptr<ChunkWriteStream> stream = OpenWriteChunk(worker, header);
  stream->Write(std::move(data), [](absl::Status) {});
  stream->Finish(
      [stream, done = std::move(done)](absl::StatusOr<v1::WriteChunkResponse> response) mutable {
        done(std::move(response));
      });
}

}  // namespace shardcoord
