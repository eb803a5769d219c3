#ifndef SHARDCOORD_COORDINATOR_RPC_WORKER_FACING_SERVICE_H_
#define SHARDCOORD_COORDINATOR_RPC_WORKER_FACING_SERVICE_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/cluster/attach_manager.h"
#include "coordinator/cluster/kv_store.h"
#include "coordinator/cluster/worker_drain.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/cluster/worker_registration.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/rpc/auth.h"
#include "coordinator/state/tensor_manager.h"
#include "proto/shardcoord.grpc.pb.h"

namespace shardcoord {

// shardcoord.v1.CoordinatorWorkers: registration, heartbeats, the rendezvous store and
// barriers, plan reports, and the buffers user processes lend (AttachManager). Thin: convert, call
// a manager, convert back. Waits (KvGet, Barrier) finish their reactor from the store's callback,
// never blocking a thread. With an `auth` (not owned; null: no authentication) every RPC first
// checks the caller's bearer token, which must have the worker role.
class WorkerFacingService final : public v1::CoordinatorWorkers::CallbackService {
 public:
  // The managers are the composition root's: `registration` registers and reconciles a
  // worker, `attach` takes the buffers user processes lend, `drain` lets workers leave.
  WorkerFacingService(const Clock* clock, WorkerManager* workers, WorkerRegistration* registration,
                      KvStore* kv, PlanManager* plans, AttachManager* attach,
                      absl::Duration heartbeat_interval, const Authenticator* auth = nullptr,
                      bool check_certificate_names = false, WorkerDrain* drain = nullptr)
      : clock_(clock),
        workers_(workers),
        registration_(registration),
        kv_(kv),
        plans_(plans),
        attach_(attach),
        heartbeat_interval_(heartbeat_interval),
        auth_(auth),
        check_certificate_names_(check_certificate_names),
        drain_(drain) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* ctx,
                                           const v1::RegisterWorkerRequest* req,
                                           v1::RegisterWorkerResponse* resp) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* req,
                                      v1::HeartbeatResponse* resp) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* ctx, const v1::KvSetRequest* req,
                                  v1::KvSetResponse* resp) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* ctx, const v1::KvGetRequest* req,
                                  v1::KvGetResponse* resp) override;
  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx, const v1::BarrierRequest* req,
                                    v1::BarrierResponse* resp) override;
  grpc::ServerUnaryReactor* ReportChunks(grpc::CallbackServerContext* ctx,
                                         const v1::ReportChunksRequest* req,
                                         v1::ReportChunksResponse* resp) override;
  grpc::ServerUnaryReactor* AttachBuffer(grpc::CallbackServerContext* ctx,
                                         const v1::AttachBufferRequest* req,
                                         v1::AttachBufferResponse* resp) override;
  grpc::ServerUnaryReactor* DetachBuffer(grpc::CallbackServerContext* ctx,
                                         const v1::DetachBufferRequest* req,
                                         v1::DetachBufferResponse* resp) override;
  grpc::ServerUnaryReactor* AttachBuffers(grpc::CallbackServerContext* ctx,
                                          const v1::AttachBuffersRequest* req,
                                          v1::AttachBuffersResponse* resp) override;

  // Finishes once the worker is gone (WorkerDrain); never blocks a thread.
  grpc::ServerUnaryReactor* LeaveWorker(grpc::CallbackServerContext* ctx,
                                        const v1::LeaveWorkerRequest* req,
                                        v1::LeaveWorkerResponse* resp) override;

 private:
  // AuthorizeCall for this service's RPC `rpc` ("RegisterWorker").
  absl::Status Authorize(grpc::CallbackServerContext* ctx, absl::string_view rpc) const;
  // With check_certificate_names (--tls-client-auth=require): the caller's certificate must
  // name the worker it speaks for (CheckPeerName), else PERMISSION_DENIED.
  absl::Status CheckWorkerName(grpc::CallbackServerContext* ctx, absl::string_view name) const;

  const Clock* const clock_;
  WorkerManager* const workers_;
  WorkerRegistration* const registration_;
  KvStore* const kv_;
  PlanManager* const plans_;
  AttachManager* const attach_;
  const absl::Duration heartbeat_interval_;
  const Authenticator* const auth_;
  const bool check_certificate_names_;
  WorkerDrain* const drain_;  // Null: LeaveWorker answers UNIMPLEMENTED.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_WORKER_FACING_SERVICE_H_
