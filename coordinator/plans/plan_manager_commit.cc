#include <algorithm>
#include <atomic>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/plans/plan_manager_internal.h"

namespace shardcoord {

// ---- Progress from workers ---------------------------------------------------------------

void PlanManager::MembersToLocked(const Transaction& t, PlanState state, WatchCalls* calls) {
  for (PlanRecord* member : t.records) {
    PlanRecord& e = *member;
    if (e.ended() || static_cast<int>(e.state) >= static_cast<int>(state)) continue;
    e.state = state;
    if (state == PlanState::kTransferred) e.transferred = t.transferred;
    if (t.fused()) {
      for (auto& c : ChangedLocked(e)) calls->push_back(std::move(c));
    }
  }
}

void PlanManager::OnExecuteDone(const std::string& txn, int64_t rank, const absl::Status& status) {
  std::string abort_reason;
  bool validate = false;
  WatchCalls calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = transactions_.find(txn);
    if (it == transactions_.end()) return;
    Transaction& t = it->second;
    if (!t.open()) return;
    const Participant& p = t.participants.at(rank);
    if (!status.ok()) {
      abort_reason =
          absl::StrCat(Describe(p.endpoint), " could not start its fragment: ", status.ToString());
    } else if (t.MarkExecuted(rank)) {
      if (t.state == PlanState::kPrepared) MembersToLocked(t, PlanState::kPrepared, &calls);
      if (t.MaybeTransferred(clock_->Now())) {
        MembersToLocked(t, PlanState::kTransferred, &calls);
        validate = true;
      }
      // A single plan's watchers see every worker's answer; a group's members its states.
      if (!t.fused()) calls = ChangedLocked(*t.records.front());
    }
  }
  if (!abort_reason.empty()) return AbortTransaction(txn, abort_reason);
  Tell(calls);
  if (validate) Validate(txn);
}

absl::Status PlanManager::Report(const WorkerReport& report) {
  const std::string& txn = report.plan_id;
  std::string abort_reason;
  bool validate = false;
  bool start_grace = false;
  WatchCalls calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = transactions_.find(txn);
    if (it == transactions_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown plan '", txn, "'"));
    }
    Transaction& t = it->second;
    if (absl::Status s = t.EndedError(); !s.ok()) return s;
    absl::StatusOr<Participant*> reporter = t.Reporter(report);
    if (!reporter.ok()) return reporter.status();
    Participant& p = **reporter;
    if (!report.error.empty()) {
      abort_reason = FailingLocked(p, report, &t.failing, &start_grace);
    } else if (!report.final) {
      p.bytes_done = std::clamp<int64_t>(report.bytes_done, p.bytes_done, p.bytes_expected);
      if (!t.fused()) {
        // A single plan's progress counts its workers' bytes as they come.
        PlanRecord& e = *t.records.front();
        e.participants.at(report.rank).bytes_done = p.bytes_done;
        calls = ChangedLocked(e);
      }
    } else if (!p.reported) {
      t.MarkReported(p);
      abort_reason = RecordChunksLocked(t, p, report);
      if (abort_reason.empty() && t.MaybeTransferred(clock_->Now())) {
        MembersToLocked(t, PlanState::kTransferred, &calls);
        validate = true;
      }
      if (!t.fused()) calls = ChangedLocked(*t.records.front());
    }
  }
  if (!abort_reason.empty()) {
    AbortTransaction(txn, abort_reason);
    return absl::OkStatus();
  }
  if (start_grace) StartGrace(txn);
  Tell(calls);
  if (validate) Validate(txn);
  return absl::OkStatus();
}

std::string PlanManager::RecordChunksLocked(Transaction& t, Participant& p,
                                            const WorkerReport& report) {
  if (!t.fused()) {
    // The one member's chunks, checked against its plan at validation (CheckReports).
    Participant& mp = t.records.front()->participants.at(report.rank);
    mp.reported = true;
    mp.chunks = report.chunks;
    mp.chunks.rank = report.rank;
    mp.checksums = report.checksums;
    mp.bytes_done = mp.bytes_expected;
    return "";
  }
  // A shape's chunks are compared with a plan's target for this rank once, however many
  // members share both.
  std::set<std::pair<const Plan*, int32_t>> matched;
  static const RankChunks kNothing;
  for (const WorkerReport::Member& m : report.members) {
    PlanRecord* e = m.index >= 0 && static_cast<size_t>(m.index) < t.records.size()
                        ? t.records[m.index]
                        : nullptr;
    auto mp = e != nullptr ? e->participants.find(report.rank)
                           : std::map<int64_t, Participant>::iterator();
    if (e == nullptr || mp == e->participants.end()) {
      return absl::StrCat(Describe(p.endpoint), " reported member ", m.index,
                          ", which it takes no part in");
    }
    const std::string& label = t.labels[m.index];
    if (m.shape < 0 || static_cast<size_t>(m.shape) >= report.shapes.size()) {
      return absl::StrCat(label, ": ", Describe(p.endpoint), " reported shape ", m.shape, " of ",
                          report.shapes.size());
    }
    const RankChunks& got = report.shapes[m.shape];
    if (matched.insert({e->plan.get(), m.shape}).second) {
      const RankChunks* planned = e->plan->target.Find(report.rank);
      const RankChunks& want = planned != nullptr ? *planned : kNothing;
      if (got.chunks != want.chunks ||
          (planned != nullptr && got.local_elements != want.local_elements)) {
        return absl::StrCat(label, ": validation failed: ", Describe(p.endpoint),
                            " reported chunks ", ChunksString(got.chunks),
                            " but the plan's target for it is ", ChunksString(want.chunks));
      }
    }
    if (m.checksums.size() != got.chunks.size()) {
      return absl::StrCat(label, ": validation failed: ", Describe(p.endpoint), " reported ",
                          m.checksums.size(), " checksums for ", got.chunks.size(), " chunks");
    }
    mp->second.reported = true;
    mp->second.checksums = m.checksums;
    mp->second.bytes_done = mp->second.bytes_expected;
  }
  return "";
}

std::string PlanManager::FailingLocked(const Participant& p, const WorkerReport& report,
                                       std::string* failing, bool* start_grace) const {
  std::string reason = absl::StrCat(Describe(p.endpoint), " failed: ", report.error);
  if (options_.failure_grace <= absl::ZeroDuration()) return reason;
  if (failing->empty()) {
    *failing = std::move(reason);
    *start_grace = true;
  }
  return "";
}

void PlanManager::StartGrace(const std::string& txn) {
  const Timer::Id id = timer_->Schedule(clock_->Now() + options_.failure_grace, [this, txn] {
    std::string reason;
    {
      absl::MutexLock lock(&mu_);
      auto it = transactions_.find(txn);
      if (it == transactions_.end()) return;
      reason = it->second.failing;
    }
    AbortTransaction(txn, reason);
  });
  absl::MutexLock lock(&mu_);
  if (auto it = transactions_.find(txn); it != transactions_.end()) it->second.grace_timer = id;
}

void PlanManager::AbortUsing(const std::string& tensor, int64_t rank, const std::string& reason) {
  auto holds = [rank](const Layout& layout) {
    const RankChunks* rc = layout.Find(rank);
    return rc != nullptr && !rc->chunks.empty();
  };
  std::vector<std::string> aborts;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : plans_) {
      if (e.ended() || e.closing) continue;
      if ((e.tensor == tensor && holds(e.plan->source)) ||
          (e.target_tensor == tensor && e.target_attached && holds(e.plan->target))) {
        aborts.push_back(id);
      }
    }
  }
  for (const std::string& id : aborts) Abort(id, reason);
}

void PlanManager::OnWorkerLost(const WorkerRecord& worker, const std::string& reason) {
  std::vector<std::pair<std::string, std::string>> aborts;  // (plan, reason)
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : plans_) {
      if (e.ended() || e.closing) continue;
      auto it = e.participants.find(worker.rank);
      if (it != e.participants.end() && it->second.endpoint.incarnation == worker.incarnation) {
        // The death is the cause; a peer's error seen in the grace is its echo.
        std::string failing;
        if (auto t = transactions_.find(e.txn); t != transactions_.end()) {
          failing = t->second.failing;
        }
        aborts.emplace_back(id, absl::StrCat(worker.Describe(), " ", reason,
                                             failing.empty() ? "" : "; before that, ", failing));
      }
    }
  }
  for (const auto& [id, why] : aborts) Abort(id, why);
}

// ---- Validation, commit, abort -----------------------------------------------------------

absl::StatusOr<LayoutChecksums> PlanManager::CheckReports(const PlanRecord& e, bool checked) {
  const Layout& target = e.plan->target;
  auto describe = [&e](int64_t rank) { return Describe(e.participants.at(rank).endpoint); };
  LayoutChecksums sums;
  sums.reserve(target.ranks().size());
  if (checked) {
    // Each report's chunks were checked against the plan's target as it came in: every
    // target rank must have reported.
    for (const RankChunks& rc : target.ranks()) {
      const Participant& p = e.participants.at(rc.rank);
      if (!p.reported) {
        return absl::FailedPreconditionError(absl::StrCat(Describe(p.endpoint),
                                                          " reported nothing of its target chunks ",
                                                          ChunksString(rc.chunks)));
      }
      sums.push_back(p.checksums);
    }
  } else {
    for (const auto& [rank, p] : e.participants) {
      const RankChunks* planned = target.Find(rank);
      static const RankChunks kNothing;
      const RankChunks& want = planned != nullptr ? *planned : kNothing;
      if (p.chunks.chunks != want.chunks ||
          (planned != nullptr && p.chunks.local_elements != want.local_elements)) {
        return absl::FailedPreconditionError(
            absl::StrCat(Describe(p.endpoint), " reported chunks ", ChunksString(p.chunks.chunks),
                         " but the plan's target for it is ", ChunksString(want.chunks)));
      }
      if (p.checksums.size() != p.chunks.chunks.size()) {
        return absl::FailedPreconditionError(absl::StrCat(Describe(p.endpoint), " reported ",
                                                          p.checksums.size(), " checksums for ",
                                                          p.chunks.chunks.size(), " chunks"));
      }
    }
    // The reported metadata must form a valid layout on its own (coverage, bounds, overlap).
    std::vector<RankChunks> reported;
    for (const RankChunks& rc : target.ranks()) {
      const Participant& p = e.participants.at(rc.rank);
      RankChunks r = p.chunks;
      r.coord = rc.coord;
      reported.push_back(std::move(r));
      sums.push_back(p.checksums);
    }
    absl::StatusOr<Layout> layout = Layout::FromChunks(target.global_shape(), std::move(reported),
                                                       target.num_partials(), target.partial_op());
    if (!layout.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("reported layout is invalid: ", layout.status().message()));
    }
  }
  // Replicas (same box, same partial index) must hold the same bytes.
  if (absl::Status s = CheckReplicaChecksums(target, sums, describe); !s.ok()) return s;
  return sums;
}

void PlanManager::Validate(const std::string& txn) {
  std::string failure;
  std::vector<CommitWork> work;
  std::vector<TensorManager::CommitItem> items;
  std::vector<Timer::Id> timers;
  bool fused = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = transactions_.find(txn);
    if (it == transactions_.end()) return;
    Transaction& t = it->second;
    if (!t.open() || !t.failing.empty()) return;
    fused = t.fused();
    // Reports are complete and no longer change; checking under the lock costs O(chunks).
    std::vector<LayoutChecksums> sums;
    sums.reserve(t.records.size());
    for (size_t i = 0; i < t.records.size(); ++i) {
      const PlanRecord& e = *t.records[i];
      if (e.ended()) {
        failure = absl::StrCat(fused ? t.labels[i] : e.id, " ended");
        break;
      }
      absl::StatusOr<LayoutChecksums> checked = CheckReports(e, /*checked=*/fused);
      if (!checked.ok()) {
        failure = t.Qualify(i, absl::StrCat("validation failed: ", checked.status().message()));
        break;
      }
      sums.push_back(*std::move(checked));
    }
    if (failure.empty()) {
      t.closing = true;  // From here on deaths and timeouts no longer abort it.
      timers = t.TakeTimers();
      work.reserve(t.records.size());
      items.reserve(t.records.size());
      for (size_t i = 0; i < t.records.size(); ++i) {
        PlanRecord& e = *t.records[i];
        CommitWork w = BeginCommitLocked(e, std::move(sums[i]));
        // The new state goes to the tensor manager; EndCommit needs only the rest.
        items.push_back(TensorManager::CommitItem{w.target_tensor, e.id, std::move(w.state)});
        work.push_back(std::move(w));
      }
    }
  }
  if (!failure.empty()) return AbortTransaction(txn, failure);
  for (Timer::Id t : timers) timer_->Cancel(t);
  // Every member's new version in one batch: no reader sees some of them new, others old.
  if (absl::Status s = tensors_->CommitAll(std::move(items)); !s.ok()) {
    {
      absl::MutexLock lock(&mu_);
      transactions_.at(txn).closing = false;
      for (const CommitWork& w : work) plans_.at(w.id).closing = false;
    }
    return AbortTransaction(
        txn, absl::StrCat(fused ? "group commit failed: " : "commit failed: ", s.message()));
  }
  EndCommit(txn, std::move(work));
}

PlanManager::CommitWork PlanManager::BeginCommitLocked(PlanRecord& e, LayoutChecksums checksums) {
  CommitWork w;
  e.closing = true;  // From here on deaths and timeouts no longer abort it.
  w.id = e.id;
  w.tensor = e.tensor;
  w.target_tensor = e.target_tensor;
  w.state.mesh = e.target_mesh;
  w.state.spec = e.target_spec;
  w.state.layout = e.plan->target;
  w.state.dtype = e.plan->target_dtype();  // A Copy's is dst's own; a load may cast.
  w.state.checksums = std::move(checksums);
  w.state.version = e.target_version;
  w.state.attached = e.target_attached;
  w.state.publish = !e.owner.empty() && !e.keep_hidden;
  for (const RankChunks& rc : e.plan->target.ranks()) {
    w.state.incarnations[rc.rank] = e.participants.at(rc.rank).endpoint.incarnation;
  }
  for (const auto& [r, p] : e.participants) w.ranks.push_back(r);
  w.old_target_version = e.old_target_version;
  return w;
}

void PlanManager::EndCommit(const std::string& txn, std::vector<CommitWork> work) {
  // Copies' sources were only read: they keep their versions and are free again.
  for (const CommitWork& w : work) {
    if (w.target_tensor != w.tensor) tensors_->Release(w.tensor, w.id);
  }
  WatchCalls calls;
  std::vector<WorkerEndpoint> finish;
  int64_t held = 0;
  bool fused = false;
  {
    absl::MutexLock lock(&mu_);
    Transaction& t = transactions_.at(txn);
    const absl::Time now = clock_->Now();
    t.state = PlanState::kCommitted;
    t.end = now;
    fused = t.fused();
    for (const CommitWork& w : work) {
      PlanRecord& e = plans_.at(w.id);
      e.state = PlanState::kCommitted;
      e.end = now;
      for (auto& c : ChangedLocked(e)) calls.push_back(std::move(c));
    }
    finish.reserve(t.participants.size());
    for (const auto& [r, p] : t.participants) finish.push_back(p.endpoint);
    held = HoldTicketLocked(t);
  }
  Tell(calls);
  // The commit is durable: the callers are answered now, not after a round trip to every
  // worker. Old buffers are dropped by FinishPlan (one per worker), which nothing waits for:
  // a later plan reads the committed version (stored on every worker before its report), a
  // drop never touches the version the plan wrote, and a FinishPlan that is lost leaves the
  // old version to the worker's next registration, as an unanswered one did before.
  for (const CommitWork& w : work) Complete(w.id, absl::OkStatus());
  // A single plan's request names its tensor; a group's names each member's by rank.
  std::map<int64_t, v1::FinishPlanRequest> requests;
  if (fused) {
    for (const CommitWork& w : work) {
      for (int64_t rank : w.ranks) {
        v1::FinishMember* m = requests[rank].add_members();
        m->set_tensor(w.target_tensor);
        m->set_drop_version(w.old_target_version);
      }
    }
  }
  std::vector<std::pair<WorkerEndpoint, v1::FinishPlanRequest>> live;
  live.reserve(finish.size());
  for (WorkerEndpoint& w : finish) {
    if (!workers_->IsLive(w.rank, w.incarnation)) continue;
    v1::FinishPlanRequest req;
    if (fused) req = std::move(requests[w.rank]);
    req.set_plan_id(txn);
    if (!fused) req.set_tensor(work.front().target_tensor);
    req.set_commit(true);
    req.set_drop_version(fused ? -1 : work.front().old_target_version);
    live.emplace_back(std::move(w), std::move(req));
  }
  FinishOnWorkers(std::move(live), held);
}

int64_t PlanManager::HoldTicketLocked(const Transaction& t) {
  const int64_t ticket = t.admission_ticket;
  if (ticket != 0) ++ticket_holds_[ticket];
  return ticket;
}

void PlanManager::Unhold(int64_t ticket) {
  if (ticket == 0) return;
  {
    absl::MutexLock lock(&mu_);
    auto it = ticket_holds_.find(ticket);
    if (it == ticket_holds_.end() || --it->second > 0) return;
    ticket_holds_.erase(it);
    if (tickets_to_release_.erase(ticket) == 0) return;
  }
  if (options_.admission != nullptr) options_.admission->Release(ticket);
}

void PlanManager::ReleaseTicket(int64_t ticket) {
  if (ticket == 0 || options_.admission == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    if (ticket_holds_.count(ticket) > 0) {
      tickets_to_release_.insert(ticket);
      return;
    }
  }
  options_.admission->Release(ticket);
}

void PlanManager::FinishOnWorkers(
    std::vector<std::pair<WorkerEndpoint, v1::FinishPlanRequest>> requests, int64_t ticket) {
  if (requests.empty()) return Unhold(ticket);
  auto left = std::make_shared<std::atomic<size_t>>(requests.size());
  for (auto& [w, req] : requests) {
    client_->FinishPlan(w, std::move(req), [this, left, ticket](absl::Status) {
      if (left->fetch_sub(1) == 1) Unhold(ticket);
    });
  }
}

void PlanManager::Abort(const std::string& id, const std::string& reason) {
  AbortWith(id, reason, absl::StatusCode::kAborted);
}

void PlanManager::AbortWith(const std::string& id, const std::string& reason,
                            absl::StatusCode code) {
  std::string txn, why;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.ended() || it->second.closing) return;
    txn = it->second.txn;
    auto t = transactions_.find(txn);
    if (t == transactions_.end()) return;
    // A group member runs inside its group's fused plan: the group aborts as a whole, the
    // reason naming the member (by its id while it is not yet listed).
    const std::vector<std::string>& members = t->second.members;
    auto at = std::find(members.begin(), members.end(), id);
    why = at != members.end() ? t->second.Qualify(at - members.begin(), reason)
          : t->second.fused() ? absl::StrCat(id, ": ", reason)
                              : reason;
  }
  AbortTransaction(txn, why, code);
}

void PlanManager::AbortTransaction(const std::string& txn, const std::string& reason,
                                   absl::StatusCode code) {
  struct Aborted {
    std::string tensor, target_tensor, id, target_mesh;
  };
  std::vector<Aborted> aborted;
  std::vector<std::pair<WorkerEndpoint, v1::FinishPlanRequest>> finish;
  std::vector<Timer::Id> timers;
  int64_t held = 0;
  std::string member_reason;
  {
    absl::MutexLock lock(&mu_);
    auto it = transactions_.find(txn);
    if (it == transactions_.end()) return;
    Transaction& t = it->second;
    if (t.closing || t.over) return;
    const absl::Time now = clock_->Now();
    if (t.MarkAborted(reason, code, now)) {
      timers = t.TakeTimers();
      // Before the tensors are released below, so no later plan reuses this epoch's keys.
      if (t.communicator_prefix == CommPrefixLocked()) ++comm_epoch_;
      if (t.sent) {
        // The workers drop the new buffers; until they did, the memory stays reserved. A
        // single plan's request names its tensor's new version.
        v1::FinishPlanRequest req;
        req.set_plan_id(txn);
        if (!t.fused()) {
          const PlanRecord& e = plans_.at(t.members.front());
          req.set_tensor(e.target_tensor);
          req.set_drop_version(e.target_version);
        }
        req.set_commit(false);
        for (const auto& [r, p] : t.participants) finish.emplace_back(p.endpoint, req);
        held = HoldTicketLocked(t);
      }
    }
    const std::string why = t.MemberReason(t.error);
    member_reason = t.MemberReason(reason);
    for (const std::string& id : t.members) {
      auto m = plans_.find(id);
      if (m == plans_.end() || m->second.ended() || m->second.closing) continue;
      PlanRecord& e = m->second;
      e.state = PlanState::kAborted;
      e.error = why;
      e.end = now;
      aborted.push_back(Aborted{e.tensor, e.target_tensor, id, e.target_mesh});
    }
  }
  for (Timer::Id t : timers) timer_->Cancel(t);
  // The old layouts were never replaced; the tensors are free again at once.
  for (const Aborted& a : aborted) ReleaseTensors(a.tensor, a.target_tensor, a.id, a.target_mesh);
  FinishOnWorkers(std::move(finish), held);
  for (const Aborted& a : aborted) {
    Complete(a.id,
             absl::Status(code, absl::StrCat("plan ", a.id, " on tensor '", a.target_tensor, "'",
                                             a.target_tensor == a.tensor
                                                 ? ""
                                                 : absl::StrCat(" (copy of '", a.tensor, "')"),
                                             " aborted: ", member_reason)));
  }
}

void PlanManager::ReleaseTensors(const std::string& tensor, const std::string& target_tensor,
                                 const std::string& id, const std::string& target_mesh) {
  if (target_tensor == tensor) return tensors_->Release(tensor, id, target_mesh);
  tensors_->Release(tensor, id);
  tensors_->Release(target_tensor, id, target_mesh);
}

void PlanManager::AbortAll(const std::string& reason) {
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, e] : plans_) {
      if (!e.ended() && !e.closing) ids.push_back(id);
    }
  }
  for (const std::string& id : ids) Abort(id, reason);
}

void PlanManager::Shutdown(const std::string& reason) {
  {
    absl::MutexLock lock(&mu_);
    closed_ = reason;
  }
  AbortAll(reason);
}

void PlanManager::Close(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  closed_ = reason;
}

bool PlanManager::IdleLocked() const {
  for (const auto& [id, e] : plans_) {
    if (!e.ended()) return false;
  }
  return true;
}

bool PlanManager::AwaitIdle(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(this, &PlanManager::IdleLocked), deadline);
}

bool PlanManager::EpochInUseLocked(const std::string& prefix) const {
  for (const auto& [id, e] : plans_) {
    if (!e.completed && e.communicator_prefix == prefix) return true;
  }
  return false;
}

void PlanManager::Complete(const std::string& id, const absl::Status& status) {
  std::vector<DoneCallback> done;
  std::vector<WatchFn> watchers;
  PlanProgress progress;
  std::string prefix;
  const char* op = "";
  std::shared_ptr<const Plan> plan;
  int64_t ticket = 0;
  bool member = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end()) return;
    PlanRecord& e = it->second;
    ++e.seq;
    progress = ProgressLocked(e);
    op = e.op;
    plan = e.plan;
    member = e.shared();
    done.swap(e.done);
    for (auto& [wid, fn] : e.watchers) watchers.push_back(std::move(fn));
    e.watchers.clear();
    // Only an abort retires the epoch's rendezvous keys (Abort moved the epoch on); a
    // committed plan leaves its communicators to the next plans over the same groups. Other
    // plans of the retired epoch may still be meeting under its keys: they go once the last
    // of them ended.
    const std::string epoch = e.communicator_prefix;
    if (!status.ok()) retired_epochs_.insert(epoch);
    e.completed = true;
    const std::string txn = e.txn;
    auto t = transactions_.find(txn);
    if (!member && t != transactions_.end()) {
      // A single plan's transaction is over with it; a group's once its last member ended
      // (OnMemberDone).
      ticket = std::exchange(t->second.admission_ticket, 0);
      t->second.over = true;
    }
    if (retired_epochs_.count(epoch) > 0 && !EpochInUseLocked(epoch)) {
      retired_epochs_.erase(epoch);
      prefix = epoch;
      // A group member's ending is told with its group's (OnMemberDone), keys included.
      if (member && t != transactions_.end()) t->second.retired_prefix = std::exchange(prefix, "");
    }
    // A group's members are retired together once its caller is answered (OnMemberDone).
    if (!member) RetireLocked(id);
  }
  // Its new buffers are committed (counted from the layouts now) or dropped: waiting plans
  // are re-checked.
  ReleaseTicket(ticket);
  if (CoordinatorMetrics* m = options_.metrics; m != nullptr) {
    const bool committed = progress.state == PlanState::kCommitted;
    m->plans->WithLabels({op, committed ? "committed" : "aborted"})->Increment();
    m->plan_duration_seconds->WithLabels({op})->Observe(progress.seconds);
    m->plan_bytes->WithLabels({op})->Observe(static_cast<double>(plan->bytes_moved));
    if (committed) {
      m->bytes_moved->Increment(static_cast<double>(plan->bytes_moved));
      m->lower_bound_bytes->Increment(static_cast<double>(plan->lower_bound_bytes));
    }
  }
  // A group's members end with their group, which is told once (OnMemberDone).
  if (options_.on_plan_end && !member) options_.on_plan_end(progress, prefix);
  for (DoneCallback& d : done) d(status, progress);
  for (WatchFn& w : watchers) w(progress);
}

}  // namespace shardcoord
