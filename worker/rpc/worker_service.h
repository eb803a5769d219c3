#ifndef SHARDCOORD_WORKER_RPC_WORKER_SERVICE_H_
#define SHARDCOORD_WORKER_RPC_WORKER_SERVICE_H_

#include "common/thread_pool.h"
#include "proto/shardcoord.grpc.pb.h"
#include "proto/shardcoord.pb.h"
#include "worker/buffers/checkpoint_io.h"
#include "worker/control/worker_core.h"

namespace shardcoord {

// shardcoord.v1.Worker over WorkerCore with the callback API. Long work (fills, the final
// checksum of a write, checkpoint file I/O, a prepared transfer's planning) runs on `pool`,
// never on a reactor thread; a transfer's run finishes its call from the run's thread.
// Without `checkpoints` the checkpoint RPCs answer UNIMPLEMENTED.
class WorkerServiceImpl final : public v1::Worker::CallbackService {
 public:
  WorkerServiceImpl(WorkerCore* core, ThreadPool* pool, CheckpointIo* checkpoints = nullptr)
      : core_(core), pool_(pool), checkpoints_(checkpoints) {}

  grpc::ServerUnaryReactor* Execute(grpc::CallbackServerContext* ctx,
                                    const v1::PlanFragment* request,
                                    v1::ExecuteResponse* response) override;
  grpc::ServerUnaryReactor* FinishPlan(grpc::CallbackServerContext* ctx,
                                       const v1::FinishPlanRequest* request,
                                       v1::FinishPlanResponse* response) override;
  grpc::ServerUnaryReactor* Fill(grpc::CallbackServerContext* ctx, const v1::FillRequest* request,
                                 v1::FillResponse* response) override;
  grpc::ServerUnaryReactor* FillMany(grpc::CallbackServerContext* ctx,
                                     const v1::FillManyRequest* request,
                                     v1::FillManyResponse* response) override;
  grpc::ServerUnaryReactor* DropTensor(grpc::CallbackServerContext* ctx,
                                       const v1::DropTensorRequest* request,
                                       v1::DropTensorResponse* response) override;
  grpc::ServerWriteReactor<v1::ChunkData>* ReadChunk(grpc::CallbackServerContext* ctx,
                                                     const v1::ReadChunkRequest* request) override;
  grpc::ServerReadReactor<v1::ChunkData>* WriteChunk(grpc::CallbackServerContext* ctx,
                                                     v1::WriteChunkResponse* response) override;
  grpc::ServerUnaryReactor* ReadBoxes(grpc::CallbackServerContext* ctx,
                                      const v1::ReadBoxesRequest* request,
                                      v1::ReadBoxesResponse* response) override;
  grpc::ServerUnaryReactor* WriteBuffer(grpc::CallbackServerContext* ctx,
                                        const v1::ChunkData* request,
                                        v1::WriteChunkResponse* response) override;
  grpc::ServerUnaryReactor* WriteCheckpoint(grpc::CallbackServerContext* ctx,
                                            const v1::WriteCheckpointRequest* request,
                                            v1::WriteCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ReadCheckpoint(grpc::CallbackServerContext* ctx,
                                           const v1::ReadCheckpointRequest* request,
                                           v1::ReadCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ReadCheckpointIndex(grpc::CallbackServerContext* ctx,
                                                const v1::ReadCheckpointIndexRequest* request,
                                                v1::ReadCheckpointIndexResponse* response) override;
  grpc::ServerUnaryReactor* CheckpointDir(grpc::CallbackServerContext* ctx,
                                          const v1::CheckpointDirRequest* request,
                                          v1::CheckpointDirResponse* response) override;
  // Prepared transfers (core->transfers()): pages on the pool (the last one plans every
  // member); a run answered from its own thread when the rank's part ended.
  grpc::ServerUnaryReactor* PrepareTransfer(grpc::CallbackServerContext* ctx,
                                            const v1::PrepareTransferRequest* request,
                                            v1::PrepareTransferResponse* response) override;
  grpc::ServerUnaryReactor* RunTransfer(grpc::CallbackServerContext* ctx,
                                        const v1::RunTransferWorkerRequest* request,
                                        v1::RunTransferWorkerResponse* response) override;
  grpc::ServerUnaryReactor* DropTransfer(grpc::CallbackServerContext* ctx,
                                         const v1::DropTransferRequest* request,
                                         v1::DropTransferResponse* response) override;
  // Block-scaled FP8 of a staged buffer (issue 28): on the pool.
  grpc::ServerUnaryReactor* BlockQuantize(grpc::CallbackServerContext* ctx,
                                          const v1::BlockQuantizeRequest* request,
                                          v1::BlockQuantizeResponse* response) override;
  // A fused tensor's buffer composed from stored boxes (issue 28 item 4): on the pool.
  grpc::ServerUnaryReactor* ComposeBoxes(grpc::CallbackServerContext* ctx,
                                         const v1::ComposeBoxesRequest* request,
                                         v1::ComposeBoxesResponse* response) override;

 private:
  // Runs `work` on the pool and finishes with its outcome (its value in `*response`).
  template <typename Response>
  grpc::ServerUnaryReactor* OnPool(grpc::CallbackServerContext* ctx, Response* response,
                                   std::function<absl::StatusOr<Response>()> work);
  // OnPool for a checkpoint call: UNIMPLEMENTED without checkpoint support.
  template <typename Response>
  grpc::ServerUnaryReactor* OnCheckpointPool(grpc::CallbackServerContext* ctx, Response* response,
                                             std::function<absl::StatusOr<Response>()> work);

  WorkerCore* const core_;
  ThreadPool* const pool_;
  CheckpointIo* const checkpoints_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_RPC_WORKER_SERVICE_H_
