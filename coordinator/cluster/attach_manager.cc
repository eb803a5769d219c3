#include "coordinator/cluster/attach_manager.h"

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace shardcoord {
namespace {

// OK when `worker` (this `incarnation`) is current and holds `rank`: a user process attaches
// through its own rank's worker.
absl::Status CheckAttacher(WorkerManager* workers, const std::string& worker, int64_t incarnation,
                           int64_t rank) {
  if (absl::Status s = workers->CheckCurrent(worker, incarnation); !s.ok()) return s;
  absl::StatusOr<WorkerRecord> w = workers->Get(worker);
  if (!w.ok()) return w.status();
  if (w->rank != rank) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank: ", w->Describe(), " holds rank ", w->rank, ", not rank ", rank,
                     "; attach through the local socket of rank ", rank, "'s worker"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<bool> AttachManager::Attach(const AttachArgs& args) {
  if (absl::Status s = CheckAttacher(workers_, args.worker, args.incarnation, args.rank); !s.ok()) {
    return s;
  }
  absl::StatusOr<TensorRecord> t = tensors_->Attach(args.tensor, args.rank, args.incarnation,
                                                    args.version, args.dtype, args.chunks);
  if (!t.ok()) return t.status();
  return LostChunks(*t, [this](int64_t rank,
                               int64_t incarnation) { return workers_->IsLive(rank, incarnation); })
      .empty();
}

absl::StatusOr<std::vector<TensorManager::Attached>> AttachManager::AttachMany(
    const AttachManyArgs& args) {
  if (absl::Status s = CheckAttacher(workers_, args.worker, args.incarnation, args.rank); !s.ok()) {
    return s;
  }
  // Who is alive now, for each tensor's `readable` (no call under the tensors' lock).
  absl::flat_hash_map<int64_t, int64_t> live;
  for (const WorkerRecord& r : workers_->List()) {
    if (r.alive) live[r.rank] = r.incarnation;
  }
  return tensors_->AttachMany(args.rank, args.incarnation, args.buffers, args.validate_only, live);
}

absl::Status AttachManager::Detach(const std::string& worker, int64_t incarnation,
                                   const std::string& tensor, int64_t rank,
                                   const std::string& reason) {
  if (absl::Status s = workers_->CheckCurrent(worker, incarnation); !s.ok()) return s;
  absl::StatusOr<bool> changed = tensors_->Detach(tensor, rank, incarnation);
  if (!changed.ok()) return changed.status();
  if (*changed) {
    plans_->AbortUsing(tensor, rank,
                       absl::StrCat("rank ", rank, "'s buffer of '", tensor, "' on worker ", worker,
                                    " was detached: ", reason));
  }
  return absl::OkStatus();
}

std::vector<std::string> AttachManager::OnWorkerLost(const WorkerRecord& worker) const {
  std::vector<std::string> served;
  for (const TensorRecord& t : tensors_->List()) {
    if (!t.attached || t.unattached.count(worker.rank)) continue;
    auto holder = t.incarnations.find(worker.rank);
    if (holder != t.incarnations.end() && holder->second == worker.incarnation) {
      served.push_back(t.name);
    }
  }
  return served;
}

}  // namespace shardcoord
