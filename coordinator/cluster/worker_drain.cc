#include "coordinator/cluster/worker_drain.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardcoord {
namespace {

// Whether `rank` holds its chunks of `tensor` in a live incarnation.
bool HoldsLive(const TensorRecord& tensor, int64_t rank, const LivenessFn& live) {
  auto inc = tensor.incarnations.find(rank);
  return inc != tensor.incarnations.end() && live(rank, inc->second);
}

// The chunks that lose their last live copy when `rank` is gone.
std::vector<LostChunk> LostWithout(const TensorRecord& tensor, int64_t rank,
                                   const LivenessFn& live) {
  if (!HoldsLive(tensor, rank, live)) return {};
  std::vector<LostChunk> out;
  for (LostChunk& c :
       LostChunks(tensor, [&](int64_t r, int64_t inc) { return r != rank && live(r, inc); })) {
    for (int64_t holder : c.ranks) {
      if (holder == rank) {
        out.push_back(std::move(c));
        break;
      }
    }
  }
  return out;
}

}  // namespace

bool NeedsRepairBeforeLeave(const TensorRecord& tensor, int64_t rank, const LivenessFn& live,
                            const std::function<bool(int64_t rank)>& alive_now) {
  for (const LostChunk& c : LostWithout(tensor, rank, live)) {
    for (int64_t holder : c.ranks) {
      if (holder != rank && alive_now(holder)) return true;
    }
  }
  return false;
}

std::string ChunksOnlyOn(const TensorRecord& tensor, int64_t rank, const LivenessFn& live) {
  std::vector<std::string> parts;
  for (const LostChunk& c : LostWithout(tensor, rank, live)) {
    parts.push_back(absl::StrCat(
        c.box.ToString(), c.partial_index ? absl::StrCat(" (partial ", c.partial_index, ")") : ""));
  }
  return absl::StrJoin(parts, "; ");
}

WorkerDrain::~WorkerDrain() {
  absl::MutexLock lock(&mu_);
  for (auto& [rank, d] : drains_) timer_->Cancel(d.timer);
}

void WorkerDrain::Leave(const std::string& name, int64_t incarnation, absl::Duration drain_timeout,
                        Done done) {
  if (drain_timeout < absl::ZeroDuration()) {
    done(absl::InvalidArgumentError(absl::StrCat(
        "drain_timeout_ms: ", absl::ToInt64Milliseconds(drain_timeout), " is negative")));
    return;
  }
  absl::StatusOr<WorkerRecord> w = workers_->SetLeaving(name, incarnation);
  if (!w.ok()) {
    done(w.status());
    return;
  }
  const int64_t rank = w->rank;
  const std::vector<std::string> running = plans_->RunningPlansOf(rank);
  {
    absl::MutexLock lock(&mu_);
    Drain& d = drains_[rank];
    d.worker = *w;
    d.deadline = clock_->Now() + drain_timeout;
    d.done = std::move(done);
    for (const std::string& id : running) d.plans[id] = false;
    d.timer = timer_->Schedule(d.deadline, [this, rank] { OnDeadline(rank); });
  }
  // Watches call back at once with the current state (maybe ended); no lock held here.
  for (const std::string& id : running) {
    absl::StatusOr<int64_t> watch = plans_->Watch(id, [this, rank, id](const PlanProgress& p) {
      if (p.ended()) PlanEnded(rank, id);
    });
    if (!watch.ok()) PlanEnded(rank, id);  // Ended and forgotten meanwhile.
  }
  Advance(rank);
}

void WorkerDrain::PlanEnded(int64_t rank, const std::string& plan_id) {
  {
    absl::MutexLock lock(&mu_);
    auto it = drains_.find(rank);
    if (it == drains_.end()) return;
    auto plan = it->second.plans.find(plan_id);
    if (plan != it->second.plans.end()) plan->second = true;
  }
  Advance(rank);
}

void WorkerDrain::RepairEnded(int64_t rank, const std::string& tensor, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    auto it = drains_.find(rank);
    if (it == drains_.end()) return;
    it->second.repairs.erase(tensor);
    if (status.ok()) it->second.outcome.repaired_tensors.push_back(tensor);
  }
  Advance(rank);
}

void WorkerDrain::OnDeadline(int64_t rank) {
  std::vector<std::string> abort;
  std::string reason;
  {
    absl::MutexLock lock(&mu_);
    auto it = drains_.find(rank);
    if (it == drains_.end()) return;
    Drain& d = it->second;
    for (const auto& [id, ended] : d.plans) {
      if (!ended) abort.push_back(id);
    }
    for (const auto& [tensor, id] : d.repairs) {
      if (!id.empty()) abort.push_back(id);
    }
    for (const std::string& id : abort) d.outcome.aborted_plans.push_back(id);
    reason =
        absl::StrCat(d.worker.Describe(), " is leaving the cluster and its drain timeout ran out");
  }
  for (const std::string& id : abort) plans_->Abort(id, reason);
}

void WorkerDrain::Advance(int64_t rank) {
  bool start_repairs = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = drains_.find(rank);
    if (it == drains_.end() || it->second.finished) return;
    Drain& d = it->second;
    for (const auto& [id, ended] : d.plans) {
      if (!ended) return;
    }
    if (d.repairs_starting) return;  // StartRepairs advances when it is done.
    if (!d.repairs_started) {
      d.repairs_started = true;
      d.repairs_starting = true;
      start_repairs = true;
    } else if (!d.repairs.empty()) {
      return;
    } else {
      d.finished = true;
    }
  }
  if (start_repairs) {
    StartRepairs(rank);
  } else {
    Finish(rank);
  }
}

void WorkerDrain::StartRepairs(int64_t rank) {
  absl::Time deadline;
  {
    absl::MutexLock lock(&mu_);
    deadline = drains_.at(rank).deadline;  // Cannot finish while repairs_starting.
  }
  if (clock_->Now() < deadline) {
    const LivenessFn live = [this](int64_t r, int64_t inc) { return workers_->IsLive(r, inc); };
    const auto alive_now = [this](int64_t r) {
      absl::StatusOr<WorkerRecord> w = workers_->GetByRank(r);
      return w.ok() && w->alive && !w->leaving;
    };
    for (const TensorRecord& t : tensors_->List()) {
      if (!NeedsRepairBeforeLeave(t, rank, live, alive_now)) continue;
      {
        absl::MutexLock lock(&mu_);
        drains_.at(rank).repairs[t.name] = "";
      }
      // The callback may run before Repair returns.
      absl::StatusOr<StartedPlan> started = plans_->Repair(
          t.name, [this, rank, name = t.name](const absl::Status& s, const PlanProgress&) {
            RepairEnded(rank, name, s);
          });
      absl::MutexLock lock(&mu_);
      Drain& d = drains_.at(rank);
      auto it = d.repairs.find(t.name);
      if (!started.ok()) {
        if (it != d.repairs.end()) d.repairs.erase(it);
      } else if (it != d.repairs.end()) {
        it->second = started->id;
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    drains_.at(rank).repairs_starting = false;
  }
  Advance(rank);
}

void WorkerDrain::Finish(int64_t rank) {
  Drain d;
  {
    absl::MutexLock lock(&mu_);
    auto it = drains_.find(rank);
    if (it == drains_.end()) return;
    d = std::move(it->second);
    drains_.erase(it);
  }
  timer_->Cancel(d.timer);
  const LivenessFn live = [this](int64_t r, int64_t inc) { return workers_->IsLive(r, inc); };
  // What only this worker holds is lost once it is gone: say so before it goes.
  for (const TensorRecord& t : tensors_->List()) {
    std::string chunks = ChunksOnlyOn(t, rank, live);
    if (!chunks.empty()) d.outcome.lost.push_back(absl::StrCat(t.name, ": ", chunks));
  }
  workers_->MarkDead(d.worker.spec.name, d.worker.incarnation, "left the cluster (drained)")
      .IgnoreError();  // NOT_FOUND cannot happen: workers are never forgotten.
  d.done(std::move(d.outcome));
}

}  // namespace shardcoord
