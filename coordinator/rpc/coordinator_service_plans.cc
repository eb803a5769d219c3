// shardcoord.v1.Coordinator's views of running work: WatchPlan, GetPlanTrace and ListPlans
// over plans (PlanManager) and prepared transfers' runs (TransferManager, ids "t-...").

#include <algorithm>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/rpc/coordinator_convert.h"
#include "coordinator/rpc/coordinator_service.h"
#include "coordinator/rpc/coordinator_service_internal.h"
#include "coordinator/rpc/grpc_auth.h"
#include "proto/grpc_status.h"

namespace shardcoord {

using internal_coordinator_service::Done;

namespace {

// Streams a plan's progress until it ends. Updates come from any thread; the newest (by
// seq) is written, one write at a time. All shared state lives in `Shared`, and the
// reactor is finished only while no write is claimed, so a watcher callback never touches
// a deleted reactor.
class WatchReactor : public grpc::ServerWriteReactor<v1::PlanProgress> {
 public:
  // Where the progress comes from: a plan's (PlanManager) or a transfer run's
  // (TransferManager), both with Watch's and Unwatch's contract.
  using WatchFn = std::function<absl::StatusOr<int64_t>(std::function<void(const PlanProgress&)>)>;
  using UnwatchFn = std::function<void(int64_t)>;

  // `release` runs once the call is done (it gives back the caller's watch slot).
  WatchReactor(const WatchFn& watch, UnwatchFn unwatch, std::function<void()> release)
      : unwatch_(std::move(unwatch)),
        release_(std::move(release)),
        shared_(std::make_shared<Shared>()) {
    shared_->reactor = this;
    std::shared_ptr<Shared> shared = shared_;
    absl::StatusOr<int64_t> id = watch([shared](const PlanProgress& p) {
      WatchReactor* reactor = nullptr;
      PlanProgress take;
      {
        absl::MutexLock lock(&shared->mu);
        if (shared->finishing || shared->reactor == nullptr || p.seq <= shared->last_seq) return;
        shared->last_seq = p.seq;
        shared->pending = p;
        if (shared->writing) return;
        shared->writing = true;
        take = *shared->pending;
        shared->pending.reset();
        reactor = shared->reactor;
      }
      reactor->Write(take);
    });
    if (!id.ok()) {
      {
        absl::MutexLock lock(&shared_->mu);
        shared_->finishing = true;
      }
      Finish(ToGrpcStatus(id.status()));
      return;
    }
    absl::MutexLock lock(&shared_->mu);
    watch_id_ = *id;
  }

  void OnWriteDone(bool ok) override {
    PlanProgress take;
    {
      absl::MutexLock lock(&shared_->mu);
      if (!ok || final_written_) {
        shared_->writing = false;
        shared_->finishing = true;
      } else if (shared_->pending.has_value()) {
        take = *shared_->pending;
        shared_->pending.reset();
      } else {
        shared_->writing = false;
        return;
      }
    }
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "stream broken"));
    if (final_written_) return Finish(grpc::Status::OK);
    Write(take);
  }

  void OnCancel() override {
    {
      absl::MutexLock lock(&shared_->mu);
      // A write in flight fails and finishes the call from OnWriteDone.
      if (shared_->finishing || shared_->writing) return;
      shared_->finishing = true;
    }
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    int64_t watch_id = 0;
    {
      absl::MutexLock lock(&shared_->mu);
      shared_->reactor = nullptr;
      watch_id = watch_id_;
    }
    if (watch_id != 0) unwatch_(watch_id);
    release_();
    delete this;
  }

 private:
  struct Shared {
    absl::Mutex mu;
    WatchReactor* reactor = nullptr;
    bool writing = false;    // A write is claimed or in flight.
    bool finishing = false;  // Finish was (or is about to be) called.
    int64_t last_seq = -1;
    std::optional<PlanProgress> pending;
  };

  // Called by the holder of the write claim only.
  void Write(const PlanProgress& p) {
    out_ = PlanProgressToProto(p);
    final_written_ = p.ended();
    StartWrite(&out_);
  }

  const UnwatchFn unwatch_;
  const std::function<void()> release_;
  std::shared_ptr<Shared> shared_;
  int64_t watch_id_ = 0;  // Guarded by shared_->mu.
  v1::PlanProgress out_;
  bool final_written_ = false;
};

}  // namespace

grpc::ServerUnaryReactor* CoordinatorService::GetPlanTrace(grpc::CallbackServerContext* ctx,
                                                           const v1::GetPlanTraceRequest* req,
                                                           v1::PlanTrace* resp) {
  if (absl::Status a = Authorize(ctx, "GetPlanTrace"); !a.ok()) return Done(ctx, a);
  if (req->plan_id().empty()) return Done(ctx, absl::InvalidArgumentError("plan_id: empty"));
  absl::StatusOr<v1::PlanTrace> trace = transfers_ != nullptr && transfers_->IsRun(req->plan_id())
                                            ? transfers_->Trace(req->plan_id())
                                            : plans_->Trace(req->plan_id());
  if (trace.ok()) *resp = *std::move(trace);
  return Done(ctx, trace.status());
}

grpc::ServerUnaryReactor* CoordinatorService::ListPlans(grpc::CallbackServerContext* ctx,
                                                        const v1::ListPlansRequest* req,
                                                        v1::ListPlansResponse* resp) {
  if (absl::Status a = Authorize(ctx, "ListPlans"); !a.ok()) return Done(ctx, a);
  if (req->limit() < 0) {
    return Done(ctx, absl::InvalidArgumentError(
                         absl::StrCat("limit: ", req->limit(), " is negative (0: the default)")));
  }
  const size_t limit = req->limit() == 0 ? kDefaultPlanListLimit : req->limit();
  std::vector<v1::PlanSummary> plans = plans_->List(limit);
  if (transfers_ != nullptr) {
    // Transfer runs among the plans, newest first.
    for (v1::PlanSummary& r : transfers_->ListRuns(limit)) plans.push_back(std::move(r));
    std::stable_sort(plans.begin(), plans.end(),
                     [](const v1::PlanSummary& a, const v1::PlanSummary& b) {
                       return a.start_unix_ms() > b.start_unix_ms();
                     });
    if (plans.size() > limit) plans.resize(limit);
  }
  for (v1::PlanSummary& p : plans) *resp->add_plans() = std::move(p);
  return Done(ctx, absl::OkStatus());
}

grpc::ServerWriteReactor<v1::PlanProgress>* CoordinatorService::WatchPlan(
    grpc::CallbackServerContext* ctx, const v1::WatchPlanRequest* req) {
  std::string caller;
  if (absl::Status a = Authorize(ctx, "WatchPlan", &caller); !a.ok()) {
    return new RefusedStream<grpc::ServerWriteReactor<v1::PlanProgress>>(a);
  }
  std::function<void()> release = [] {};
  if (watches_ != nullptr) {
    if (absl::Status s = watches_->Acquire(caller); !s.ok()) {
      return new RefusedStream<grpc::ServerWriteReactor<v1::PlanProgress>>(s);
    }
    release = [quota = watches_, caller] { quota->Release(caller); };
  }
  const std::string id = req->plan_id();
  if (transfers_ != nullptr && transfers_->IsRun(id)) {
    return new WatchReactor(
        [t = transfers_, id](TransferManager::WatchFn fn) { return t->Watch(id, std::move(fn)); },
        [t = transfers_, id](int64_t watch) { t->Unwatch(id, watch); }, std::move(release));
  }
  return new WatchReactor(
      [p = plans_, id](PlanManager::WatchFn fn) { return p->Watch(id, std::move(fn)); },
      [p = plans_, id](int64_t watch) { p->Unwatch(id, watch); }, std::move(release));
}

}  // namespace shardcoord
