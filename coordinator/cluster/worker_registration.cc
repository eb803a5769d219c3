#include "coordinator/cluster/worker_registration.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcoord {

absl::StatusOr<WorkerRegistration::Registered> WorkerRegistration::Register(
    const WorkerSpec& spec, const std::vector<HeldBuffer>& held) {
  absl::StatusOr<WorkerRecord> w = workers_->Register(spec);
  if (!w.ok()) return w.status();
  absl::StatusOr<std::vector<std::pair<std::string, int64_t>>> drop =
      tensors_->Reconcile(w->rank, w->incarnation, held);
  if (!drop.ok()) {
    // The worker never hears of this incarnation: it must not stay alive for plans to use
    // until its heartbeat timeout. Listeners hear of it as of any death.
    workers_
        ->MarkDead(spec.name, w->incarnation,
                   absl::StrCat("registration failed: ", drop.status().message()))
        .IgnoreError();
    return drop.status();
  }
  return Registered{*std::move(w), *std::move(drop)};
}

}  // namespace shardcoord
