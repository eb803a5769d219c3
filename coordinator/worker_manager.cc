#include "coordinator/worker_manager.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace shardcoord {

std::string WorkerRecord::Describe() const {
  return absl::StrCat("worker ", spec.name, " (rank ", rank, ")");
}

WorkerManager::WorkerManager(const Clock* clock, absl::Duration heartbeat_timeout)
    : clock_(clock), heartbeat_timeout_(heartbeat_timeout) {}

void WorkerManager::AddListener(WorkerListener* listener) {
  absl::MutexLock lock(&mu_);
  listeners_.push_back(listener);
}

void WorkerManager::Notify(const std::vector<std::pair<WorkerRecord, std::string>>& lost) {
  if (lost.empty()) return;
  std::vector<WorkerListener*> listeners;
  {
    absl::MutexLock lock(&mu_);
    listeners = listeners_;
  }
  for (const auto& [worker, reason] : lost) {
    for (WorkerListener* l : listeners) l->OnWorkerLost(worker, reason);
  }
}

absl::StatusOr<WorkerRecord> WorkerManager::Register(const WorkerSpec& spec) {
  if (spec.name.empty()) return absl::InvalidArgumentError("name: empty");
  if (spec.address.empty()) return absl::InvalidArgumentError("address: empty");
  std::vector<std::pair<WorkerRecord, std::string>> lost;
  WorkerRecord out;
  {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = rank_of_.emplace(spec.name, static_cast<int64_t>(workers_.size()));
    if (inserted) {
      workers_.emplace_back();
      workers_.back().rank = it->second;
    }
    WorkerRecord& w = workers_[it->second];
    if (!inserted && w.alive) {
      lost.emplace_back(w, absl::StrCat("re-registered (incarnation ", w.incarnation,
                                        " replaced by ", last_incarnation_ + 1, ")"));
    }
    w.spec = spec;
    w.incarnation = ++last_incarnation_;
    w.alive = true;
    w.last_heartbeat = clock_->Now();
    w.death_reason.clear();
    out = w;
  }
  Notify(lost);
  return out;
}

absl::Status WorkerManager::CheckCurrent(absl::string_view name, int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  auto it = rank_of_.find(name);
  if (it == rank_of_.end()) return absl::NotFoundError(absl::StrCat("unknown worker '", name, "'"));
  const WorkerRecord& w = workers_[it->second];
  if (w.incarnation != incarnation) {
    return absl::AbortedError(absl::StrCat(w.Describe(), ": stale incarnation ", incarnation,
                                           " (current ", w.incarnation, "); register again"));
  }
  if (!w.alive) {
    return absl::AbortedError(
        absl::StrCat(w.Describe(), " was declared dead (", w.death_reason, "); register again"));
  }
  return absl::OkStatus();
}

absl::Status WorkerManager::Heartbeat(absl::string_view name, int64_t incarnation) {
  if (absl::Status s = CheckCurrent(name, incarnation); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  // Re-checked under this lock: a registration or death may have come in between.
  WorkerRecord& w = workers_[rank_of_.at(name)];
  if (w.incarnation != incarnation || !w.alive) {
    return absl::AbortedError(absl::StrCat(w.Describe(), ": incarnation ", incarnation,
                                           " is no longer current; register again"));
  }
  w.last_heartbeat = clock_->Now();
  return absl::OkStatus();
}

std::vector<WorkerRecord> WorkerManager::CheckHealth(absl::Time now) {
  std::vector<std::pair<WorkerRecord, std::string>> lost;
  {
    absl::MutexLock lock(&mu_);
    for (WorkerRecord& w : workers_) {
      if (!w.alive || now - w.last_heartbeat <= heartbeat_timeout_) continue;
      w.alive = false;
      w.death_reason =
          absl::StrCat("no heartbeat for ", absl::FormatDuration(now - w.last_heartbeat),
                       " (timeout ", absl::FormatDuration(heartbeat_timeout_), ")");
      lost.emplace_back(w, absl::StrCat("died: ", w.death_reason));
    }
  }
  Notify(lost);
  std::vector<WorkerRecord> dead;
  for (auto& [w, reason] : lost) dead.push_back(std::move(w));
  return dead;
}

absl::Status WorkerManager::MarkDead(absl::string_view name, int64_t incarnation,
                                     const std::string& reason) {
  std::vector<std::pair<WorkerRecord, std::string>> lost;
  {
    absl::MutexLock lock(&mu_);
    auto it = rank_of_.find(name);
    if (it == rank_of_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown worker '", name, "'"));
    }
    WorkerRecord& w = workers_[it->second];
    if (w.alive && w.incarnation == incarnation) {
      w.alive = false;
      w.death_reason = reason;
      lost.emplace_back(w, absl::StrCat("died: ", reason));
    }
  }
  Notify(lost);
  return absl::OkStatus();
}

std::vector<WorkerRecord> WorkerManager::List() const {
  absl::MutexLock lock(&mu_);
  return workers_;
}

absl::StatusOr<WorkerRecord> WorkerManager::Get(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = rank_of_.find(name);
  if (it == rank_of_.end()) return absl::NotFoundError(absl::StrCat("unknown worker '", name, "'"));
  return workers_[it->second];
}

absl::StatusOr<WorkerRecord> WorkerManager::GetByRank(int64_t rank) const {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int64_t>(workers_.size())) {
    return absl::NotFoundError(absl::StrCat("no worker has rank ", rank));
  }
  return workers_[rank];
}

bool WorkerManager::IsLive(int64_t rank, int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  if (rank < 0 || rank >= static_cast<int64_t>(workers_.size())) return false;
  return workers_[rank].alive && workers_[rank].incarnation == incarnation;
}

std::vector<std::string> WorkerManager::HostsByRank() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> hosts;
  hosts.reserve(workers_.size());
  for (const WorkerRecord& w : workers_) hosts.push_back(w.spec.host);
  return hosts;
}

}  // namespace shardcoord
