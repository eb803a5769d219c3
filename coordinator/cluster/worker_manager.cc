#include "coordinator/cluster/worker_manager.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

std::string WorkerRecord::Describe() const { return DescribeWorker(spec.name, rank); }

absl::Status WorkerRecord::DeadError(absl::string_view what) const {
  if (awaited) {
    return absl::UnavailableError(
        absl::StrCat(Describe(), " ", what, " (", death_reason, "); retry shortly"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat(Describe(), " ", what, " (", death_reason, ")"));
}

namespace {
constexpr char kWorkerKind[] = "worker";
}  // namespace

WorkerManager::WorkerManager(const Clock* clock, absl::Duration heartbeat_timeout,
                             StateStore* store)
    : clock_(clock), heartbeat_timeout_(heartbeat_timeout), store_(store) {}

absl::Status WorkerManager::Persist(const WorkerRecord& w) {
  if (store_ == nullptr) return absl::OkStatus();
  v1::WorkerInfo info;
  info.set_name(w.spec.name);
  info.set_rank(w.rank);
  info.set_host(w.spec.host);
  info.set_device(w.spec.device);
  info.set_address(w.spec.address);
  info.set_backend(w.spec.backend);
  info.set_local_socket(w.spec.local_socket);
  info.set_incarnation(w.incarnation);
  info.set_state(w.alive ? v1::ALIVE : v1::DEAD);
  return store_->Put(kWorkerKind, w.spec.name, info.SerializeAsString());
}

absl::Status WorkerManager::Load() {
  if (store_ == nullptr) return absl::OkStatus();
  absl::StatusOr<std::vector<StateRecord>> records = store_->Load(kWorkerKind);
  if (!records.ok()) return records.status();
  absl::MutexLock lock(&mu_);
  for (const StateRecord& r : *records) {
    v1::WorkerInfo info;
    if (!info.ParseFromString(r.value) || info.name() != r.name || info.rank() < 0) {
      return absl::InternalError(absl::StrCat("state store: bad worker record '", r.name, "'"));
    }
    if (info.rank() >= static_cast<int64_t>(workers_.size())) workers_.resize(info.rank() + 1);
    WorkerRecord& w = workers_[info.rank()];
    if (!w.spec.name.empty()) {
      return absl::InternalError(absl::StrCat("state store: workers '", w.spec.name, "' and '",
                                              info.name(), "' both have rank ", info.rank()));
    }
    w.spec = WorkerSpec{info.name(),    info.host(),    info.device(),
                        info.address(), info.backend(), info.local_socket()};
    w.rank = info.rank();
    w.incarnation = info.incarnation();
    w.alive = false;
    w.awaited = true;
    w.death_reason = "coordinator restarted; not registered again yet";
    rank_of_[info.name()] = info.rank();
    last_incarnation_ = std::max(last_incarnation_, info.incarnation());
    if (info.state() == v1::ALIVE) live_before_restart_[info.rank()] = info.incarnation();
  }
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i].spec.name.empty()) {
      return absl::InternalError(absl::StrCat("state store: no worker has rank ", i));
    }
  }
  return absl::OkStatus();
}

void WorkerManager::EndAwaiting() {
  absl::MutexLock lock(&mu_);
  for (WorkerRecord& w : workers_) {
    if (!w.awaited) continue;
    w.awaited = false;
    w.death_reason = "coordinator restarted; did not register again within the recovery timeout";
  }
}

bool WorkerManager::WasLiveBeforeRestart(int64_t rank, int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  auto it = live_before_restart_.find(rank);
  return it != live_before_restart_.end() && it->second == incarnation;
}

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

void WorkerManager::NotifyMemory(const WorkerRecord& worker) {
  std::vector<WorkerListener*> listeners;
  {
    absl::MutexLock lock(&mu_);
    listeners = listeners_;
  }
  for (WorkerListener* l : listeners) l->OnWorkerMemory(worker);
}

absl::StatusOr<WorkerRecord> WorkerManager::Register(const WorkerSpec& spec) {
  if (spec.name.empty()) return absl::InvalidArgumentError("name: empty");
  if (spec.address.empty()) return absl::InvalidArgumentError("address: empty");
  std::vector<std::pair<WorkerRecord, std::string>> lost;
  WorkerRecord out;
  {
    absl::MutexLock lock(&mu_);
    auto found = rank_of_.find(spec.name);
    const bool known = found != rank_of_.end();
    WorkerRecord next;
    if (known) next = workers_[found->second];
    next.rank = known ? found->second : static_cast<int64_t>(workers_.size());
    next.spec = spec;
    next.incarnation = last_incarnation_ + 1;
    next.alive = true;
    next.awaited = false;
    next.last_heartbeat = clock_->Now();
    next.death_reason.clear();
    next.leaving = false;
    // Durable before it takes effect: a rank handed out is never handed to another name.
    if (absl::Status s = Persist(next); !s.ok()) return s;
    ++last_incarnation_;
    if (!known) {
      rank_of_.emplace(spec.name, next.rank);
      workers_.emplace_back();
    }
    WorkerRecord& w = workers_[next.rank];
    if (known && w.alive) {
      lost.emplace_back(w, absl::StrCat("re-registered (incarnation ", w.incarnation,
                                        " replaced by ", next.incarnation, ")"));
    }
    w = next;
    out = w;
  }
  Notify(lost);
  if (out.spec.memory.budget_bytes > 0) NotifyMemory(out);
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

absl::Status WorkerManager::Heartbeat(absl::string_view name, int64_t incarnation,
                                      const WorkerMemory* memory) {
  if (absl::Status s = CheckCurrent(name, incarnation); !s.ok()) return s;
  WorkerRecord reported;
  {
    absl::MutexLock lock(&mu_);
    // Re-checked under this lock: a registration or death may have come in between.
    WorkerRecord& w = workers_[rank_of_.at(name)];
    if (w.incarnation != incarnation || !w.alive) {
      return absl::AbortedError(absl::StrCat(w.Describe(), ": incarnation ", incarnation,
                                             " is no longer current; register again"));
    }
    w.last_heartbeat = clock_->Now();
    if (memory == nullptr) return absl::OkStatus();
    w.spec.memory = *memory;
    reported = w;
  }
  NotifyMemory(reported);
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
      // Best effort: a death that was not stored only means that after a restart this
      // incarnation's chunks are accepted if the worker reports them intact.
      Persist(w).IgnoreError();
    }
  }
  Notify(lost);
  std::vector<WorkerRecord> dead;
  for (auto& [w, reason] : lost) dead.push_back(std::move(w));
  return dead;
}

absl::StatusOr<WorkerRecord> WorkerManager::SetLeaving(absl::string_view name,
                                                       int64_t incarnation) {
  if (absl::Status s = CheckCurrent(name, incarnation); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  WorkerRecord& w = workers_[rank_of_.at(name)];
  if (w.incarnation != incarnation || !w.alive) {  // Changed since CheckCurrent.
    return absl::AbortedError(
        absl::StrCat(w.Describe(), ": incarnation ", incarnation, " is no longer current"));
  }
  if (w.leaving)
    return absl::FailedPreconditionError(absl::StrCat(w.Describe(), " is already leaving"));
  w.leaving = true;
  return w;
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
      Persist(w).IgnoreError();  // Best effort, as in CheckHealth.
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
  absl::StatusOr<const WorkerRecord*> w = WorkerOfRank(workers_, rank);
  if (!w.ok()) return w.status();
  return **w;
}

bool WorkerManager::IsLive(int64_t rank, int64_t incarnation) const {
  absl::MutexLock lock(&mu_);
  return IsLiveIn(workers_, rank, incarnation);
}

std::vector<std::string> WorkerManager::HostsByRank() const {
  absl::MutexLock lock(&mu_);
  return HostsOf(workers_);
}

absl::StatusOr<const WorkerRecord*> WorkerOfRank(const std::vector<WorkerRecord>& workers,
                                                 int64_t rank) {
  if (rank < 0 || rank >= static_cast<int64_t>(workers.size())) {
    return absl::NotFoundError(absl::StrCat("no worker has rank ", rank));
  }
  return &workers[rank];
}

bool IsLiveIn(const std::vector<WorkerRecord>& workers, int64_t rank, int64_t incarnation) {
  if (rank < 0 || rank >= static_cast<int64_t>(workers.size())) return false;
  return workers[rank].alive && workers[rank].incarnation == incarnation;
}

std::vector<std::string> HostsOf(const std::vector<WorkerRecord>& workers) {
  std::vector<std::string> hosts;
  hosts.reserve(workers.size());
  for (const WorkerRecord& w : workers) hosts.push_back(w.spec.host);
  return hosts;
}

}  // namespace shardcoord
