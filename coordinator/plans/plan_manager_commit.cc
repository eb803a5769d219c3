#include <algorithm>
#include <atomic>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/plans/plan_manager_internal.h"
#include "sharding/fused_stream.h"

namespace shardcoord {

// ---- Progress from workers ---------------------------------------------------------------

void PlanManager::OnExecuteDone(const std::string& id, int64_t rank, const absl::Status& status) {
  std::string abort_reason;
  bool validate = false;
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end()) return;
    Entry& e = it->second;
    if (e.state_ended() || e.closing) return;
    Participant& p = e.participants.at(rank);
    if (!status.ok()) {
      abort_reason =
          absl::StrCat(Describe(p.endpoint), " could not start its fragment: ", status.ToString());
    } else if (!p.executed) {
      p.executed = true;
      ++e.executed;
      const int64_t n = static_cast<int64_t>(e.participants.size());
      if (e.executed == n && e.state == PlanState::kPending) e.state = PlanState::kPrepared;
      if (e.executed == n && e.reported == n && e.failing.empty()) {
        e.state = PlanState::kTransferred;
        e.transferred = clock_->Now();
        validate = true;
      }
      calls = ChangedLocked(e);
    }
  }
  if (!abort_reason.empty()) return Abort(id, abort_reason);
  Tell(calls);
  if (validate) Validate(id);
}

absl::Status PlanManager::Report(const WorkerReport& report) {
  bool group = false;
  {
    absl::MutexLock lock(&mu_);
    group = groups_.count(report.plan_id) > 0;
  }
  if (group) return ReportGroup(report);
  std::string abort_reason;
  bool validate = false;
  bool start_grace = false;
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(report.plan_id);
    if (it == plans_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown plan '", report.plan_id, "'"));
    }
    Entry& e = it->second;
    if (e.state_ended() || e.closing) {
      return absl::AbortedError(
          absl::StrCat("plan ", e.id, " already ended (", PlanStateName(e.state), ")"));
    }
    absl::StatusOr<Participant*> reporter = Reporter(e.participants, report, e.id);
    if (!reporter.ok()) return reporter.status();
    Participant& p = **reporter;
    if (!report.error.empty()) {
      abort_reason = FailingLocked(p, report, &e.failing, &start_grace);
    } else if (!report.final) {
      p.bytes_done = std::clamp<int64_t>(report.bytes_done, p.bytes_done, p.bytes_expected);
      calls = ChangedLocked(e);
    } else if (!p.reported) {
      p.reported = true;
      ++e.reported;
      p.chunks = report.chunks;
      p.chunks.rank = report.rank;
      p.checksums = report.checksums;
      p.bytes_done = p.bytes_expected;
      const int64_t n = static_cast<int64_t>(e.participants.size());
      if (e.executed == n && e.reported == n && e.failing.empty()) {
        e.state = PlanState::kTransferred;
        e.transferred = clock_->Now();
        validate = true;
      }
      calls = ChangedLocked(e);
    }
  }
  if (!abort_reason.empty()) {
    Abort(report.plan_id, abort_reason);
    return absl::OkStatus();
  }
  if (start_grace) StartGrace(report.plan_id, /*group=*/false);
  Tell(calls);
  if (validate) Validate(report.plan_id);
  return absl::OkStatus();
}

absl::StatusOr<v1::PlanTrace> PlanManager::Trace(const std::string& plan_id) const {
  absl::MutexLock lock(&mu_);
  if (auto git = groups_.find(plan_id); git != groups_.end()) {
    // The fused plan: the group's phases and each worker's exchange rounds.
    const Group& g = git->second;
    v1::PlanTrace out;
    out.set_plan_id(g.id);
    out.set_tensor(absl::StrCat(g.members.size(), g.members.size() == 1 ? " tensor" : " tensors"));
    out.set_op("group");
    out.set_state(static_cast<v1::PlanState>(static_cast<int>(g.state)));
    out.set_error(g.error);
    out.set_start_unix_us(absl::ToUnixMicros(g.start));
    if (g.transferred != absl::InfinitePast()) {
      out.set_transferred_unix_us(absl::ToUnixMicros(g.transferred));
    }
    if (g.end != absl::InfiniteFuture()) out.set_end_unix_us(absl::ToUnixMicros(g.end));
    for (const auto& [rank, p] : g.participants) {
      v1::RankTrace* r = out.add_ranks();
      *r = p.timing;
      r->set_rank(rank);
      r->set_worker(p.endpoint.name);
    }
    return out;
  }
  auto it = plans_.find(plan_id);
  if (it == plans_.end()) return absl::NotFoundError(absl::StrCat("unknown plan '", plan_id, "'"));
  const Entry& e = it->second;
  const PlanProgress progress = ProgressLocked(e);
  // A group member ran inside its group's fused plan: its ranks' tracks are the group's.
  const Group* group = nullptr;
  if (auto g = groups_.find(e.group); !e.group.empty() && g != groups_.end()) group = &g->second;
  v1::PlanTrace out;
  out.set_plan_id(e.id);
  out.set_tensor(e.target_tensor);
  out.set_op(e.op);
  out.set_state(static_cast<v1::PlanState>(static_cast<int>(progress.state)));
  out.set_error(e.error);
  out.set_start_unix_us(absl::ToUnixMicros(e.start));
  if (e.transferred != absl::InfinitePast()) {
    out.set_transferred_unix_us(absl::ToUnixMicros(e.transferred));
  }
  if (e.end != absl::InfiniteFuture()) out.set_end_unix_us(absl::ToUnixMicros(e.end));
  for (const auto& [rank, p] : e.participants) {
    v1::RankTrace* r = out.add_ranks();
    *r = p.timing;
    if (group != nullptr) {
      auto gp = group->participants.find(rank);
      if (gp != group->participants.end()) *r = gp->second.timing;
    }
    r->set_rank(rank);
    r->set_worker(p.endpoint.name);
  }
  return out;
}

std::vector<v1::PlanSummary> PlanManager::List(size_t limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<const Entry*> entries;
  entries.reserve(plans_.size());
  for (const auto& [id, e] : plans_) entries.push_back(&e);
  // Ids do not sort by age ("p-9" > "p-10"); start times do, ties broken by id.
  std::sort(entries.begin(), entries.end(), [](const Entry* a, const Entry* b) {
    return a->start != b->start ? a->start > b->start : a->id > b->id;
  });
  if (entries.size() > limit) entries.resize(limit);
  std::vector<v1::PlanSummary> out;
  out.reserve(entries.size());
  for (const Entry* e : entries) {
    const PlanProgress progress = ProgressLocked(*e);
    v1::PlanSummary& p = out.emplace_back();
    p.set_plan_id(e->id);
    p.set_tensor(e->target_tensor);
    p.set_source_tensor(e->tensor);
    p.set_op(e->op);
    p.set_group(e->group);
    p.set_state(static_cast<v1::PlanState>(static_cast<int>(progress.state)));
    p.set_bytes_done(progress.bytes_done);
    p.set_bytes_moved(e->plan->bytes_moved);
    p.set_lower_bound_bytes(e->plan->lower_bound_bytes);
    p.set_start_unix_ms(absl::ToUnixMillis(e->start));
    p.set_seconds(progress.seconds);
    p.set_error(e->error);
  }
  return out;
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
      if (e.state_ended() || e.closing) continue;
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
      if (e.state_ended() || e.closing) continue;
      auto it = e.participants.find(worker.rank);
      if (it != e.participants.end() && it->second.endpoint.incarnation == worker.incarnation) {
        // The death is the cause; a peer's error seen in the grace is its echo.
        std::string failing = e.failing;
        if (auto g = groups_.find(e.group); g != groups_.end()) failing = g->second.failing;
        aborts.emplace_back(id, absl::StrCat(worker.Describe(), " ", reason,
                                             failing.empty() ? "" : "; before that, ", failing));
      }
    }
  }
  for (const auto& [id, why] : aborts) Abort(id, why);
}

// ---- Validation, commit, abort -----------------------------------------------------------

absl::StatusOr<LayoutChecksums> PlanManager::CheckReports(const Entry& e) {
  const Layout& target = e.plan->target;
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
  LayoutChecksums sums;
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
  // Replicas (same box, same partial index) must hold the same bytes.
  if (absl::Status s = CheckReplicaChecksums(
          target, sums, [&e](int64_t rank) { return Describe(e.participants.at(rank).endpoint); });
      !s.ok()) {
    return s;
  }
  return sums;
}

void PlanManager::Validate(const std::string& id) {
  absl::StatusOr<LayoutChecksums> sums;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.state_ended() || it->second.closing ||
        !it->second.failing.empty()) {
      return;
    }
    // Reports are complete and no longer change; checking under the lock keeps it simple
    // and costs O(chunks).
    sums = CheckReports(it->second);
  }
  if (!sums.ok()) {
    return Abort(id, absl::StrCat("validation failed: ", sums.status().message()));
  }
  Commit(id, *std::move(sums));
}

PlanManager::CommitWork PlanManager::BeginCommitLocked(Entry& e, LayoutChecksums checksums) {
  CommitWork w;
  e.closing = true;  // From here on deaths and timeouts no longer abort it.
  w.tensor = e.tensor;
  w.target_tensor = e.target_tensor;
  w.state.mesh = e.target_mesh;
  w.state.spec = e.target_spec;
  w.state.layout = e.plan->target;
  w.state.checksums = std::move(checksums);
  w.state.version = e.target_version;
  w.state.attached = e.target_attached;
  w.state.publish = !e.owner.empty() && !e.keep_hidden;
  for (const RankChunks& rc : e.plan->target.ranks()) {
    w.state.incarnations[rc.rank] = e.participants.at(rc.rank).endpoint.incarnation;
  }
  for (const auto& [r, p] : e.participants) {
    // A group's FinishPlans go per worker, not per member: ranks are enough.
    if (e.group.empty()) {
      w.finish.push_back(p.endpoint);
    } else {
      w.finish_ranks.push_back(r);
    }
  }
  w.old_target_version = e.old_target_version;
  w.timer = e.timer;
  return w;
}

void PlanManager::Commit(const std::string& id, LayoutChecksums checksums) {
  CommitWork work;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.state_ended() || it->second.closing) return;
    work = BeginCommitLocked(it->second, std::move(checksums));
  }
  timer_->Cancel(work.timer);
  if (absl::Status s = tensors_->Commit(work.target_tensor, id, work.state); !s.ok()) {
    {
      absl::MutexLock lock(&mu_);
      plans_.at(id).closing = false;
    }
    return Abort(id, absl::StrCat("commit failed: ", s.message()));
  }
  EndCommit(id, work);
}

void PlanManager::EndCommit(const std::string& id, const CommitWork& work) {
  // A Copy's source was only read: it keeps its version and is free again.
  if (work.target_tensor != work.tensor) tensors_->Release(work.tensor, id);
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  int64_t held = 0;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = plans_.at(id);
    e.state = PlanState::kCommitted;
    e.end = clock_->Now();
    calls = ChangedLocked(e);
    held = HoldTicketLocked(e);
  }
  Tell(calls);
  // The commit is durable: the caller is answered now, not after a round trip to every
  // worker. Old buffers are dropped by FinishPlan, which nothing waits for: a later plan
  // reads the committed version (stored on every worker before its report), a drop never
  // touches the version the plan wrote, and a FinishPlan that is lost leaves the old version
  // to the worker's next registration, as an unanswered one did before.
  Complete(id, absl::OkStatus());
  v1::FinishPlanRequest req;
  req.set_plan_id(id);
  req.set_tensor(work.target_tensor);
  req.set_commit(true);
  req.set_drop_version(work.old_target_version);
  std::vector<WorkerEndpoint> live;
  for (const WorkerEndpoint& w : work.finish) {
    if (workers_->IsLive(w.rank, w.incarnation)) live.push_back(w);
  }
  FinishOnWorkers(req, std::move(live), held);
}

int64_t PlanManager::HoldTicketLocked(const Entry& e) {
  int64_t ticket = e.admission_ticket;
  if (ticket == 0 && !e.group.empty()) {
    auto g = groups_.find(e.group);
    if (g != groups_.end()) ticket = g->second.admission_ticket;
  }
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

void PlanManager::FinishOnWorkers(const v1::FinishPlanRequest& req,
                                  std::vector<WorkerEndpoint> workers, int64_t ticket) {
  std::vector<std::pair<WorkerEndpoint, v1::FinishPlanRequest>> requests;
  requests.reserve(workers.size());
  for (WorkerEndpoint& w : workers) requests.emplace_back(std::move(w), req);
  FinishOnWorkers(std::move(requests), ticket);
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
  std::vector<WorkerEndpoint> participants;
  std::string tensor, target_tensor, target_mesh;
  int64_t target_version = 0;
  Timer::Id timer = 0, grace_timer = 0;
  int64_t held = 0;
  std::string group;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.state_ended() || it->second.closing) return;
    Entry& e = it->second;
    group = e.group;
  }
  // A group member runs inside its group's fused plan: the group aborts as a whole, the
  // reason naming the member.
  if (!group.empty()) {
    std::string label = id;
    {
      absl::MutexLock lock(&mu_);
      if (auto g = groups_.find(group); g != groups_.end()) {
        const auto& members = g->second.members;
        auto at = std::find(members.begin(), members.end(), id);
        if (at != members.end()) label = g->second.labels[at - members.begin()];
      }
    }
    return AbortGroup(group, absl::StrCat(label, ": ", reason));
  }
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.state_ended() || it->second.closing) return;
    Entry& e = it->second;
    e.state = PlanState::kAborted;
    held = HoldTicketLocked(e);
    e.error = reason;
    // Before the tensor is released below, so no later plan reuses this epoch's keys.
    if (e.communicator_prefix == CommPrefixLocked()) {
      ++comm_epoch_;
    }
    e.end = clock_->Now();
    for (const auto& [r, p] : e.participants) participants.push_back(p.endpoint);
    tensor = e.tensor;
    target_tensor = e.target_tensor;
    target_mesh = e.target_mesh;
    target_version = e.target_version;
    timer = e.timer;
    grace_timer = e.grace_timer;
  }
  if (timer != 0) timer_->Cancel(timer);
  if (grace_timer != 0) timer_->Cancel(grace_timer);
  // The old layout was never replaced; the tensors are free again at once.
  ReleaseTensors(tensor, target_tensor, id, target_mesh);
  v1::FinishPlanRequest req;
  req.set_plan_id(id);
  req.set_tensor(target_tensor);
  req.set_commit(false);
  req.set_drop_version(target_version);
  FinishOnWorkers(req, std::move(participants), held);
  Complete(id, absl::Status(code, absl::StrCat("plan ", id, " on tensor '", target_tensor, "'",
                                               target_tensor == tensor
                                                   ? ""
                                                   : absl::StrCat(" (copy of '", tensor, "')"),
                                               " aborted: ", reason)));
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
      if (!e.state_ended() && !e.closing) ids.push_back(id);
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
    if (!e.state_ended()) return false;
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
    Entry& e = it->second;
    ++e.seq;
    progress = ProgressLocked(e);
    op = e.op;
    plan = e.plan;
    member = !e.group.empty();
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
    ticket = e.admission_ticket;
    e.admission_ticket = 0;
    const std::string group = e.group;
    // A group's members are retired together once its caller is answered (OnMemberDone).
    if (!member) RetireLocked(id);
    if (retired_epochs_.count(epoch) > 0 && !EpochInUseLocked(epoch)) {
      retired_epochs_.erase(epoch);
      prefix = epoch;
      // A group member's ending is told with its group's (OnMemberDone), keys included.
      if (auto g = groups_.find(group); member && g != groups_.end()) {
        g->second.retired_prefix = std::exchange(prefix, "");
      }
    }
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
