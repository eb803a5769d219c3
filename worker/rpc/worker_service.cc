#include "worker/rpc/worker_service.h"

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/grpc_status.h"
#include "worker/control/transfer_runner.h"

namespace shardcoord {
namespace {

// Finishes `reactor` with `r`'s status, and with its value in `*response` when it has one.
template <typename Response>
void FinishWith(grpc::ServerUnaryReactor* reactor, Response* response, absl::StatusOr<Response> r) {
  if (r.ok()) *response = *std::move(r);
  reactor->Finish(ToGrpcStatus(r.status()));
}

// A reactor answered at once: with `status`, or with `r` as FinishWith.
grpc::ServerUnaryReactor* Answered(grpc::CallbackServerContext* ctx, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}
template <typename Response>
grpc::ServerUnaryReactor* Answered(grpc::CallbackServerContext* ctx, Response* response,
                                   absl::StatusOr<Response> r) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  FinishWith(reactor, response, std::move(r));
  return reactor;
}

}  // namespace

template <typename Response>
grpc::ServerUnaryReactor* WorkerServiceImpl::OnPool(
    grpc::CallbackServerContext* ctx, Response* response,
    std::function<absl::StatusOr<Response>()> work) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  pool_->Schedule(
      [reactor, response, work = std::move(work)] { FinishWith(reactor, response, work()); });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Execute(grpc::CallbackServerContext* ctx,
                                                     const v1::PlanFragment* request,
                                                     v1::ExecuteResponse* /*response*/) {
  return Answered(ctx, core_->Execute(*request));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::FinishPlan(grpc::CallbackServerContext* ctx,
                                                        const v1::FinishPlanRequest* request,
                                                        v1::FinishPlanResponse* /*response*/) {
  return Answered(ctx, core_->FinishPlan(*request));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Fill(grpc::CallbackServerContext* ctx,
                                                  const v1::FillRequest* request,
                                                  v1::FillResponse* response) {
  return OnPool<v1::FillResponse>(ctx, response, [this, request] { return core_->Fill(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::BlockQuantize(grpc::CallbackServerContext* ctx,
                                                           const v1::BlockQuantizeRequest* request,
                                                           v1::BlockQuantizeResponse* response) {
  return OnPool<v1::BlockQuantizeResponse>(
      ctx, response, [this, request] { return core_->BlockQuantize(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ComposeBoxes(grpc::CallbackServerContext* ctx,
                                                          const v1::ComposeBoxesRequest* request,
                                                          v1::ComposeBoxesResponse* response) {
  return OnPool<v1::ComposeBoxesResponse>(
      ctx, response, [this, request] { return core_->ComposeBoxes(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::FillMany(grpc::CallbackServerContext* ctx,
                                                      const v1::FillManyRequest* request,
                                                      v1::FillManyResponse* response) {
  return OnPool<v1::FillManyResponse>(ctx, response,
                                      [this, request] { return core_->FillMany(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::DropTensor(grpc::CallbackServerContext* ctx,
                                                        const v1::DropTensorRequest* request,
                                                        v1::DropTensorResponse* /*response*/) {
  return Answered(ctx, core_->DropTensor(*request));
}

namespace {

// A streaming reactor (grpc::ServerWriteReactor or ServerReadReactor) that deletes itself
// when the call is done.
template <typename Base>
class OwnedReactor : public Base {
 public:
  void OnDone() override { delete this; }

 protected:
  // Finishes the call with `s` when it failed; whether it did.
  bool FinishedOnError(const absl::Status& s) {
    if (s.ok()) return false;
    this->Finish(ToGrpcStatus(s));
    return true;
  }
};

class ReadChunkReactor : public OwnedReactor<grpc::ServerWriteReactor<v1::ChunkData>> {
 public:
  ReadChunkReactor(WorkerCore* core, const v1::ReadChunkRequest& request) {
    absl::StatusOr<WorkerCore::ChunkReader> reader = core->OpenRead(request);
    if (FinishedOnError(reader.status())) return;
    reader_ = *std::move(reader);
    message_.set_tensor(request.tensor());
    message_.set_version(request.version());
    message_.set_total_bytes(reader_.total_bytes());
    // The header travels alone; data follows in messages of at most 1 MiB.
    StartWrite(&message_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      return;
    }
    if (reader_.done()) {
      Finish(grpc::Status::OK);
      return;
    }
    message_.Clear();
    if (FinishedOnError(reader_.Next(kMaxChunkMessageBytes, message_.mutable_data()))) return;
    StartWrite(&message_);
  }

 private:
  WorkerCore::ChunkReader reader_;
  v1::ChunkData message_;
};

class WriteChunkReactor : public OwnedReactor<grpc::ServerReadReactor<v1::ChunkData>> {
 public:
  WriteChunkReactor(WorkerCore* core, ThreadPool* pool, v1::WriteChunkResponse* response)
      : core_(core), pool_(pool), response_(response) {
    StartRead(&message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // The client finished sending.
      if (writer_ == nullptr) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no header message"));
        return;
      }
      pool_->Schedule([this] {  // Checksumming a large buffer is long work.
        absl::StatusOr<v1::WriteChunkResponse> r = writer_->Finish();
        if (r.ok()) *response_ = *std::move(r);
        Finish(ToGrpcStatus(r.status()));
      });
      return;
    }
    absl::Status s;
    if (writer_ == nullptr) {
      absl::StatusOr<std::unique_ptr<WorkerCore::ChunkWriter>> w = core_->OpenWrite(message_);
      if (w.ok()) writer_ = *std::move(w);
      s = w.status();
    } else {
      s = writer_->Append(message_.data());
    }
    if (FinishedOnError(s)) return;
    StartRead(&message_);
  }

 private:
  WorkerCore* const core_;
  ThreadPool* const pool_;
  v1::WriteChunkResponse* const response_;
  v1::ChunkData message_;
  std::unique_ptr<WorkerCore::ChunkWriter> writer_;
};

}  // namespace

grpc::ServerWriteReactor<v1::ChunkData>* WorkerServiceImpl::ReadChunk(
    grpc::CallbackServerContext* /*ctx*/, const v1::ReadChunkRequest* request) {
  return new ReadChunkReactor(core_, *request);
}

grpc::ServerReadReactor<v1::ChunkData>* WorkerServiceImpl::WriteChunk(
    grpc::CallbackServerContext* /*ctx*/, v1::WriteChunkResponse* response) {
  return new WriteChunkReactor(core_, pool_, response);
}

// Small, bounded by kMaxRelayBytes: answered on the reactor, no hop to the pool.
grpc::ServerUnaryReactor* WorkerServiceImpl::ReadBoxes(grpc::CallbackServerContext* ctx,
                                                       const v1::ReadBoxesRequest* request,
                                                       v1::ReadBoxesResponse* response) {
  return Answered(ctx, response, core_->ReadBoxes(*request));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::WriteBuffer(grpc::CallbackServerContext* ctx,
                                                         const v1::ChunkData* request,
                                                         v1::WriteChunkResponse* response) {
  return Answered(ctx, response, core_->WriteBuffer(*request));
}

// ---- Prepared transfers ------------------------------------------------------------------

grpc::ServerUnaryReactor* WorkerServiceImpl::PrepareTransfer(
    grpc::CallbackServerContext* ctx, const v1::PrepareTransferRequest* request,
    v1::PrepareTransferResponse* response) {
  // Every page parses a slice of the table; the last plans every member (seconds at 10^5).
  return OnPool<v1::PrepareTransferResponse>(
      ctx, response, [this, request] { return core_->transfers()->Prepare(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::RunTransfer(
    grpc::CallbackServerContext* ctx, const v1::RunTransferWorkerRequest* request,
    v1::RunTransferWorkerResponse* response) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // Finished from the run's thread when the part ended, or here when refused.
  core_->transfers()->Run(*request,
                          [reactor, response](absl::StatusOr<v1::RunTransferWorkerResponse> r) {
                            FinishWith(reactor, response, std::move(r));
                          });
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::DropTransfer(grpc::CallbackServerContext* ctx,
                                                          const v1::DropTransferRequest* request,
                                                          v1::DropTransferResponse* /*response*/) {
  core_->transfers()->Drop(*request);
  return Answered(ctx, absl::OkStatus());
}

// ---- Checkpoints: file I/O is long work, on the pool ---------------------------------------

template <typename Response>
grpc::ServerUnaryReactor* WorkerServiceImpl::OnCheckpointPool(
    grpc::CallbackServerContext* ctx, Response* response,
    std::function<absl::StatusOr<Response>()> work) {
  if (checkpoints_ == nullptr)
    return Answered(ctx, absl::UnimplementedError("no checkpoint support"));
  return OnPool(ctx, response, std::move(work));
}

grpc::ServerUnaryReactor* WorkerServiceImpl::WriteCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::WriteCheckpointRequest* request,
    v1::WriteCheckpointResponse* response) {
  return OnCheckpointPool<v1::WriteCheckpointResponse>(
      ctx, response, [this, request] { return checkpoints_->Write(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReadCheckpoint(
    grpc::CallbackServerContext* ctx, const v1::ReadCheckpointRequest* request,
    v1::ReadCheckpointResponse* response) {
  return OnCheckpointPool<v1::ReadCheckpointResponse>(
      ctx, response, [this, request] { return checkpoints_->Read(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReadCheckpointIndex(
    grpc::CallbackServerContext* ctx, const v1::ReadCheckpointIndexRequest* request,
    v1::ReadCheckpointIndexResponse* response) {
  return OnCheckpointPool<v1::ReadCheckpointIndexResponse>(
      ctx, response, [this, request] { return checkpoints_->ReadIndex(*request); });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::CheckpointDir(grpc::CallbackServerContext* ctx,
                                                           const v1::CheckpointDirRequest* request,
                                                           v1::CheckpointDirResponse* response) {
  return OnCheckpointPool<v1::CheckpointDirResponse>(
      ctx, response, [this, request]() -> absl::StatusOr<v1::CheckpointDirResponse> {
        absl::Status s = checkpoints_->Dir(*request);
        if (!s.ok()) return s;
        return v1::CheckpointDirResponse();
      });
}

}  // namespace shardcoord
