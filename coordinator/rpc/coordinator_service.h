#ifndef SHARDCOORD_COORDINATOR_RPC_COORDINATOR_SERVICE_H_
#define SHARDCOORD_COORDINATOR_RPC_COORDINATOR_SERVICE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "coordinator/checkpoints/checkpoint_manager.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/io/tensor_io.h"
#include "coordinator/plans/block_copy.h"
#include "coordinator/plans/coordinator_metrics.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/plans/slice_copy.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/rpc/caller_quota.h"
#include "coordinator/rpc/coordinator_convert.h"
#include "coordinator/rpc/request_log.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/transfers/transfer_manager.h"
#include "proto/shardcoord.grpc.pb.h"

namespace shardcoord {

// ListPlans without a limit.
inline constexpr int64_t kDefaultPlanListLimit = 100;

// shardcoord.v1.Coordinator: thin adapters over the managers. No handler blocks: long
// operations (create, redistribute with wait, upload, download, watch) finish their reactor
// from the managers' completion callbacks. Streamed data messages carry at most
// `max_message_bytes` of data. With an `auth` (not owned; null: no authentication) every
// RPC first checks the caller's bearer token (coordinator/rpc/grpc_auth.h). With `requests` (not
// owned; null: none), mutating RPCs with a request_id answer a retry with the first outcome.
class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorService(WorkerManager* workers, MeshManager* meshes, TensorManager* tensors,
                     PlanManager* plans, TensorIo* io, int64_t max_message_bytes = 1 << 20,
                     CoordinatorMetrics* metrics = nullptr, const Authenticator* auth = nullptr,
                     RequestLog* requests = nullptr, CallerQuota* watches = nullptr,
                     CallerQuota* running_plans = nullptr, CheckpointManager* checkpoints = nullptr,
                     TransferManager* transfers = nullptr, BlockCopy* block_copy = nullptr,
                     SliceCopier* slices = nullptr)
      : workers_(workers),
        meshes_(meshes),
        tensors_(tensors),
        plans_(plans),
        io_(io),
        max_message_bytes_(max_message_bytes),
        upload_bytes_(metrics == nullptr ? nullptr : metrics->upload_bytes),
        download_bytes_(metrics == nullptr ? nullptr : metrics->download_bytes),
        auth_(auth),
        requests_(requests),
        watches_(watches),
        running_plans_(running_plans),
        checkpoints_(checkpoints),
        transfers_(transfers),
        block_copy_(block_copy),
        slices_(slices) {}

  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* ctx,
                                        const v1::ListWorkersRequest* req,
                                        v1::ListWorkersResponse* resp) override;
  grpc::ServerUnaryReactor* CreateMesh(grpc::CallbackServerContext* ctx,
                                       const v1::CreateMeshRequest* req,
                                       v1::MeshInfo* resp) override;
  grpc::ServerUnaryReactor* GetMesh(grpc::CallbackServerContext* ctx, const v1::GetMeshRequest* req,
                                    v1::MeshInfo* resp) override;
  grpc::ServerUnaryReactor* ListMeshes(grpc::CallbackServerContext* ctx,
                                       const v1::ListMeshesRequest* req,
                                       v1::ListMeshesResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteMesh(grpc::CallbackServerContext* ctx,
                                       const v1::DeleteMeshRequest* req,
                                       v1::DeleteMeshResponse* resp) override;
  grpc::ServerUnaryReactor* CreateTensor(grpc::CallbackServerContext* ctx,
                                         const v1::CreateTensorRequest* req,
                                         v1::TensorInfo* resp) override;
  grpc::ServerUnaryReactor* GetTensor(grpc::CallbackServerContext* ctx,
                                      const v1::GetTensorRequest* req,
                                      v1::TensorInfo* resp) override;
  grpc::ServerUnaryReactor* ListTensors(grpc::CallbackServerContext* ctx,
                                        const v1::ListTensorsRequest* req,
                                        v1::ListTensorsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteTensor(grpc::CallbackServerContext* ctx,
                                         const v1::DeleteTensorRequest* req,
                                         v1::DeleteTensorResponse* resp) override;
  grpc::ServerUnaryReactor* CreateTensors(grpc::CallbackServerContext* ctx,
                                          const v1::CreateTensorsRequest* req,
                                          v1::CreateTensorsResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteTensors(grpc::CallbackServerContext* ctx,
                                          const v1::DeleteTensorsRequest* req,
                                          v1::DeleteTensorsResponse* resp) override;
  grpc::ServerUnaryReactor* Redistribute(grpc::CallbackServerContext* ctx,
                                         const v1::RedistributeRequest* req,
                                         v1::RedistributeResponse* resp) override;
  grpc::ServerUnaryReactor* Gather(grpc::CallbackServerContext* ctx, const v1::GatherRequest* req,
                                   v1::RedistributeResponse* resp) override;
  grpc::ServerUnaryReactor* Copy(grpc::CallbackServerContext* ctx, const v1::CopyRequest* req,
                                 v1::CopyResponse* resp) override;
  grpc::ServerUnaryReactor* CopyGroup(grpc::CallbackServerContext* ctx,
                                      const v1::CopyGroupRequest* req,
                                      v1::CopyGroupResponse* resp) override;
  grpc::ServerUnaryReactor* RedistributeGroup(grpc::CallbackServerContext* ctx,
                                              const v1::RedistributeGroupRequest* req,
                                              v1::RedistributeGroupResponse* resp) override;
  grpc::ServerUnaryReactor* GatherGroup(grpc::CallbackServerContext* ctx,
                                        const v1::GatherGroupRequest* req,
                                        v1::RedistributeGroupResponse* resp) override;
  grpc::ServerUnaryReactor* PlanRedistribute(grpc::CallbackServerContext* ctx,
                                             const v1::PlanRequest* req, v1::Plan* resp) override;
  grpc::ServerWriteReactor<v1::PlanProgress>* WatchPlan(grpc::CallbackServerContext* ctx,
                                                        const v1::WatchPlanRequest* req) override;
  grpc::ServerUnaryReactor* GetPlanTrace(grpc::CallbackServerContext* ctx,
                                         const v1::GetPlanTraceRequest* req,
                                         v1::PlanTrace* resp) override;
  grpc::ServerUnaryReactor* ListPlans(grpc::CallbackServerContext* ctx,
                                      const v1::ListPlansRequest* req,
                                      v1::ListPlansResponse* resp) override;
  grpc::ServerReadReactor<v1::TensorData>* Upload(grpc::CallbackServerContext* ctx,
                                                  v1::UploadResponse* resp) override;
  grpc::ServerWriteReactor<v1::TensorData>* Download(grpc::CallbackServerContext* ctx,
                                                     const v1::DownloadRequest* req) override;
  // Checkpoints (issue 13): adapters over CheckpointManager (UNIMPLEMENTED without one).
  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* ctx,
                                           const v1::SaveCheckpointRequest* req,
                                           v1::SaveCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* LoadCheckpoint(grpc::CallbackServerContext* ctx,
                                           const v1::LoadCheckpointRequest* req,
                                           v1::LoadCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* InspectCheckpoint(grpc::CallbackServerContext* ctx,
                                              const v1::InspectCheckpointRequest* req,
                                              v1::InspectCheckpointResponse* resp) override;
  grpc::ServerUnaryReactor* GetCheckpointProgress(grpc::CallbackServerContext* ctx,
                                                  const v1::GetCheckpointProgressRequest* req,
                                                  v1::CheckpointProgress* resp) override;
  // Prepared transfers (issue 27; coordinator_service_transfers.cc): adapters over
  // TransferManager (UNIMPLEMENTED without one). A run's id answers WatchPlan, GetPlanTrace
  // and ListPlans as a plan's.
  grpc::ServerUnaryReactor* CreateTransfer(grpc::CallbackServerContext* ctx,
                                           const v1::CreateTransferRequest* req,
                                           v1::TransferInfo* resp) override;
  grpc::ServerUnaryReactor* RunTransfer(grpc::CallbackServerContext* ctx,
                                        const v1::RunTransferRequest* req,
                                        v1::RunTransferResponse* resp) override;
  grpc::ServerUnaryReactor* GetTransfer(grpc::CallbackServerContext* ctx,
                                        const v1::GetTransferRequest* req,
                                        v1::TransferInfo* resp) override;
  grpc::ServerUnaryReactor* ListTransfers(grpc::CallbackServerContext* ctx,
                                          const v1::ListTransfersRequest* req,
                                          v1::ListTransfersResponse* resp) override;
  grpc::ServerUnaryReactor* DeleteTransfer(grpc::CallbackServerContext* ctx,
                                           const v1::DeleteTransferRequest* req,
                                           v1::DeleteTransferResponse* resp) override;

 private:
  LivenessFn Liveness() const;
  // AuthorizeCall for this service's RPC `rpc` ("ListWorkers"); `caller` as there.
  absl::Status Authorize(grpc::CallbackServerContext* ctx, absl::string_view rpc,
                         std::string* caller = nullptr) const;
  // Takes a running-plan slot of the caller of `ctx` (OK when there is no quota); the
  // returned function gives it back (call it once, when the plan or group ended).
  absl::StatusOr<std::function<void()>> TakePlanSlot(grpc::CallbackServerContext* ctx);
  // Redistribute, Gather and Copy: start a plan; with `wait`, finish when it ends. Fills the
  // response's plan and progress.
  // `request_id` and `resp` (the whole response) go to Reply.
  grpc::ServerUnaryReactor* RunPlan(
      grpc::CallbackServerContext* ctx, bool wait, const std::string& request_id,
      const google::protobuf::Message* resp, v1::Plan* resp_plan, v1::PlanProgress* resp_progress,
      const std::function<absl::StatusOr<StartedPlan>(PlanManager::DoneCallback)>& start);

  // CopyGroup and RedistributeGroup: start the group; `on_started` fills the response from
  // what started; with `wait`, `on_committed` adds the final progress and the call finishes
  // when the group ends.
  grpc::ServerUnaryReactor* RunGroup(
      grpc::CallbackServerContext* ctx, bool wait, const std::string& request_id,
      const google::protobuf::Message* resp,
      const std::function<absl::StatusOr<StartedGroup>(PlanManager::GroupDoneCallback)>& start,
      const std::function<void(const StartedGroup&)>& on_started,
      std::function<void(const GroupProgress&)> on_committed);

  // A Copy or CopyGroup with slices (SliceCopier::Start, errors naming "copies[i]").
  absl::StatusOr<StartedGroup> StartSliced(const std::vector<SliceCopyMember>& members,
                                           PlanManager::GroupDoneCallback done);

  // Idempotent retries. A mutating handler, once its request is valid, calls Replay: a
  // non-null reactor (the first outcome replayed into `resp`, or an error) is returned as is;
  // null means act, and the outcome then goes through Reply, which records it under the
  // request's id before finishing the reactor.
  template <typename Request>
  grpc::ServerUnaryReactor* Replay(grpc::CallbackServerContext* ctx, const char* method,
                                   const Request& req, google::protobuf::Message* resp);
  void Reply(grpc::ServerUnaryReactor* reactor, const std::string& request_id,
             const absl::Status& s, const google::protobuf::Message& resp);
  // Copy with quantize / dequantize (coordinator/plans/block_copy.h): answers when it ended.
  grpc::ServerUnaryReactor* BlockCopyCall(grpc::CallbackServerContext* ctx,
                                          const BlockCopyArgs& args, const v1::CopyRequest* req,
                                          v1::CopyResponse* resp);
  // A CopyGroup with block members (BlockCopy::StartGroup): answers when it ended.
  grpc::ServerUnaryReactor* BlockCopyGroupCall(grpc::CallbackServerContext* ctx,
                                               const std::vector<BlockCopyArgs>& members,
                                               const v1::CopyGroupRequest* req,
                                               v1::CopyGroupResponse* resp);
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx, const std::string& request_id,
                                  const absl::Status& s, const google::protobuf::Message& resp);

  WorkerManager* const workers_;
  MeshManager* const meshes_;
  TensorManager* const tensors_;
  PlanManager* const plans_;
  TensorIo* const io_;
  const int64_t max_message_bytes_;
  // Where streamed data bytes are counted; null: not counted.
  Counter* const upload_bytes_;
  Counter* const download_bytes_;
  const Authenticator* const auth_;
  RequestLog* const requests_;
  // Per-caller bounds (null: none): open WatchPlan streams, plans and groups running.
  CallerQuota* const watches_;
  CallerQuota* const running_plans_;
  CheckpointManager* const checkpoints_;
  TransferManager* const transfers_;
  BlockCopy* const block_copy_;  // Null: block copies answer UNIMPLEMENTED.
  // Copies with slices of fused tensors (null: refused with UNIMPLEMENTED).
  SliceCopier* const slices_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_COORDINATOR_SERVICE_H_
