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

// ---- Groups ------------------------------------------------------------------------------

absl::Status CheckCopyGroup(const std::vector<CopyMember>& copies) {
  if (copies.empty()) return absl::InvalidArgumentError("copies: empty group");
  std::map<std::string, std::string> seen;  // tensor -> "copies[i].field"
  for (size_t i = 0; i < copies.size(); ++i) {
    const CopyMember& c = copies[i];
    for (const auto& [field, name] :
         {std::make_pair("src", &c.src), std::make_pair("dst", &c.dst)}) {
      const std::string where = absl::StrCat("copies[", i, "].", field);
      if (name->empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty"));
      auto [it, inserted] = seen.emplace(*name, where);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", *name, "' is also ",
                                                       it->second,
                                                       "; a group names each tensor once"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StartedGroup> PlanManager::CopyGroup(const std::vector<CopyMember>& copies,
                                                    GroupDoneCallback done) {
  if (absl::Status s = CheckCopyGroup(copies); !s.ok()) return s;
  // "copies[i]: MESSAGE", or "copies[i].dst: ..." where MESSAGE names the field.
  auto prefixed = [](size_t i, const absl::Status& s) {
    const bool field =
        absl::StartsWith(s.message(), "src: ") || absl::StartsWith(s.message(), "dst: ");
    return absl::Status(s.code(), absl::StrCat("copies[", i, "]", field ? "." : ": ", s.message()));
  };
  // Every member is checked before anything is held.
  for (size_t i = 0; i < copies.size(); ++i) {
    absl::StatusOr<TensorRecord> src = tensors_->Get(copies[i].src);
    if (!src.ok()) {
      return prefixed(
          i, absl::Status(src.status().code(), absl::StrCat("src: ", src.status().message())));
    }
    absl::StatusOr<TensorRecord> dst = tensors_->Get(copies[i].dst);
    if (!dst.ok()) {
      return prefixed(
          i, absl::Status(dst.status().code(), absl::StrCat("dst: ", dst.status().message())));
    }
    if (absl::Status s = CheckCopyable(*src, *dst); !s.ok()) return prefixed(i, s);
  }
  std::vector<GroupItem> items;
  for (size_t i = 0; i < copies.size(); ++i) {
    items.push_back(
        GroupItem{"copy", copies[i].src, copies[i].dst,
                  [](const TensorRecord& rec) -> absl::StatusOr<Target> {
                    return Target{rec.layout, rec.mesh, rec.spec};
                  },
                  absl::StrCat("copies[", i, "]"),
                  absl::StrCat("copies[", i, "] ('", copies[i].src, "' -> '", copies[i].dst, "'")});
  }
  return StartGroup(items, std::move(done));
}

absl::Status CheckRedistributeGroup(const std::vector<RedistributeMember>& members) {
  if (members.empty()) return absl::InvalidArgumentError("redistributes: empty group");
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string where = absl::StrCat("redistributes[", i, "].tensor");
    if (members[i].tensor.empty())
      return absl::InvalidArgumentError(absl::StrCat(where, ": empty"));
    auto [it, inserted] = seen.emplace(members[i].tensor, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", members[i].tensor,
                                                     "' is also redistributes[", it->second,
                                                     "].tensor; a group names each tensor once"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StartedGroup> PlanManager::RedistributeGroup(
    const std::vector<RedistributeMember>& members, GroupDoneCallback done) {
  if (absl::Status s = CheckRedistributeGroup(members); !s.ok()) return s;
  // Members of one shape sent to one spec on one mesh (a model's layers) share their target
  // layout: it is resolved once. Used only during this call, on this thread.
  auto targets = std::make_shared<absl::flat_hash_map<std::string, Target>>();
  auto resolve = [this, targets](const TensorRecord& rec,
                                 const Spec& spec) -> absl::StatusOr<Target> {
    std::string key = absl::StrCat(spec.mesh.empty() ? rec.mesh : spec.mesh, "|",
                                   absl::StrJoin(rec.shape, ","), "|", spec.ToString());
    if (auto it = targets->find(key); it != targets->end()) return it->second;
    absl::StatusOr<Target> t = ResolveSpec(rec, spec);
    if (t.ok()) targets->emplace(std::move(key), *t);
    return t;
  };
  // Every member's tensor and spec are checked before anything is held.
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string where = absl::StrCat("redistributes[", i, "]");
    absl::StatusOr<TensorRecord> rec = tensors_->Get(members[i].tensor);
    if (!rec.ok()) {
      return absl::Status(rec.status().code(),
                          absl::StrCat(where, ".tensor: ", rec.status().message()));
    }
    if (absl::StatusOr<Target> t = resolve(*rec, members[i].target); !t.ok()) {
      const bool field = absl::StartsWith(t.status().message(), "target");
      return absl::Status(t.status().code(),
                          absl::StrCat(where, field ? "." : ": ", t.status().message()));
    }
  }
  std::vector<GroupItem> items;
  for (size_t i = 0; i < members.size(); ++i) {
    const Spec spec = members[i].target;
    items.push_back(GroupItem{
        "redistribute", members[i].tensor, members[i].tensor,
        [resolve, spec](const TensorRecord& rec) { return resolve(rec, spec); },
        absl::StrCat("redistributes[", i, "]"),
        absl::StrCat("redistributes[", i, "] ('", members[i].tensor, "' -> ", spec.ToString(),
                     spec.mesh.empty() ? "" : absl::StrCat(" on ", spec.mesh))});
  }
  return StartGroup(items, std::move(done));
}

absl::StatusOr<StartedGroup> PlanManager::LoadGroup(const std::string& owner,
                                                    const std::vector<LoadMember>& members,
                                                    GroupDoneCallback done) {
  if (members.empty()) return absl::InvalidArgumentError("tensors: empty group");
  std::vector<GroupItem> items;
  for (size_t i = 0; i < members.size(); ++i) {
    const LoadMember& m = members[i];
    GroupItem item;
    item.op = "load";
    item.tensor = m.staging;
    item.where = absl::StrCat("tensors[", i, "]");
    item.owner = owner;
    item.keep_hidden = m.keep_hidden;
    if (!m.into.empty()) {
      item.target_tensor = m.into;
      item.target_fn = [](const TensorRecord& rec) -> absl::StatusOr<Target> {
        return Target{rec.layout, rec.mesh, rec.spec};
      };
      item.label = absl::StrCat(item.where, " (into '", m.into, "'");
    } else {
      const Spec spec = m.target;
      item.target_tensor = m.staging;
      item.target_fn = [this, spec](const TensorRecord& rec) { return ResolveSpec(rec, spec); };
      item.label =
          absl::StrCat(item.where, " ('", m.staging, "' -> ", spec.ToString(), " on ", spec.mesh);
    }
    items.push_back(std::move(item));
  }
  return StartGroup(items, std::move(done));
}

absl::Status CheckGatherGroup(const std::vector<std::string>& tensors) {
  if (tensors.empty()) return absl::InvalidArgumentError("tensors: empty group");
  std::map<std::string, size_t> seen;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string where = absl::StrCat("tensors[", i, "]");
    if (tensors[i].empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty"));
    auto [it, inserted] = seen.emplace(tensors[i], i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", tensors[i],
                                                     "' is also tensors[", it->second,
                                                     "]; a group names each tensor once"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StartedGroup> PlanManager::GatherGroup(const std::vector<std::string>& tensors,
                                                      const std::string& mesh,
                                                      std::optional<int64_t> to_rank,
                                                      GroupDoneCallback done) {
  if (absl::Status s = CheckGatherGroup(tensors); !s.ok()) return s;
  // Every tensor and its target are checked before anything is held.
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string where = absl::StrCat("tensors[", i, "]");
    absl::StatusOr<TensorRecord> rec = tensors_->Get(tensors[i]);
    if (!rec.ok()) {
      return absl::Status(rec.status().code(), absl::StrCat(where, ": ", rec.status().message()));
    }
    if (absl::StatusOr<Target> t = GatherTarget(*rec, mesh, to_rank); !t.ok()) {
      return absl::Status(t.status().code(), absl::StrCat(where, ": ", t.status().message()));
    }
  }
  std::vector<GroupItem> items;
  for (size_t i = 0; i < tensors.size(); ++i) {
    items.push_back(GroupItem{
        "gather", tensors[i], tensors[i],
        [this, mesh, to_rank](const TensorRecord& rec) { return GatherTarget(rec, mesh, to_rank); },
        absl::StrCat("tensors[", i, "]"), absl::StrCat("tensors[", i, "] ('", tensors[i], "'")});
  }
  return StartGroup(items, std::move(done));
}

absl::StatusOr<StartedGroup> PlanManager::StartGroup(const std::vector<GroupItem>& items,
                                                     GroupDoneCallback done) {
  std::string gid, prefix;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.empty()) return absl::UnavailableError(closed_);
    gid = options_.id_namespace.empty()
              ? absl::StrCat("g-", next_group_++)
              : absl::StrCat("g-", options_.id_namespace, ".", next_group_++);
    prefix = CommPrefixLocked();
    Group& g = groups_[gid];
    g.id = gid;
    g.start = clock_->Now();
    g.done = std::move(done);
    g.finals.resize(items.size());
    g.communicator_prefix = prefix;
  }
  StartedGroup out;
  out.id = gid;
  out.members.reserve(items.size());
  std::vector<FragmentMemberOptions> options(items.size());
  int64_t bucket_bytes = 0;
  const WorkerView view = ViewWorkers();
  GroupMemo memo;
  for (size_t i = 0; i < items.size(); ++i) {
    FusedMember fused;
    fused.memo = &memo;
    fused.workers = &view;
    fused.communicator_prefix = prefix;
    fused.options.index = static_cast<int32_t>(i);
    absl::StatusOr<StartedPlan> started = Start(
        items[i].op, items[i].tensor, items[i].target_tensor, items[i].target_fn,
        [this, gid, i](const absl::Status& s, const PlanProgress& p) {
          OnMemberDone(gid, i, s, p);
        },
        gid, &fused, items[i].owner);
    if (!started.ok()) {
      // Nothing was sent: the members started so far are forgotten, their tensors freed.
      for (const StartedPlan& m : out.members) Discard(m.id);
      absl::MutexLock lock(&mu_);
      groups_.erase(gid);
      return absl::Status(started.status().code(),
                          absl::StrCat(items[i].where, ": ", started.status().message()));
    }
    options[i] = fused.options;
    bucket_bytes =
        bucket_bytes == 0 ? fused.bucket_bytes : std::min(bucket_bytes, fused.bucket_bytes);
    out.bytes_moved += started->plan->bytes_moved;
    out.lower_bound_bytes += started->plan->lower_bound_bytes;
    {
      absl::MutexLock lock(&mu_);
      Group& g = groups_.at(gid);
      // Before any fragment is sent, so before it can commit.
      if (auto it = plans_.find(started->id); it != plans_.end()) {
        it->second.keep_hidden = items[i].keep_hidden;
      }
      g.members.push_back(started->id);
      g.labels.push_back(absl::StrCat(items[i].label, ", plan ", started->id, ")"));
    }
    out.members.push_back(*std::move(started));
  }
  auto plans = std::make_shared<std::vector<const Plan*>>();
  plans->reserve(out.members.size());
  for (const StartedPlan& m : out.members) plans->push_back(m.plan.get());
  bool failed = false;
  std::string error;
  {
    absl::MutexLock lock(&mu_);
    Group& g = groups_.at(gid);
    failed = g.failed;
    error = g.error;
  }
  if (failed) {
    // A member was aborted (a worker died) before anything was sent: end the rest unsent.
    AbortGroup(gid, error);
    return out;
  }
  // The group's memory is admitted as one (all or nothing): every member's new buffers, and
  // one fused fragment's staging per rank.
  std::vector<std::string> ids;
  ids.reserve(out.members.size());
  MemoryDemand demand;
  {
    absl::MutexLock lock(&mu_);
    for (const StartedPlan& m : out.members) {
      ids.push_back(m.id);
      auto it = plans_.find(m.id);
      // A member's demand has no staging (Start): the fused fragment stages instead.
      if (it != plans_.end()) demand.Add(it->second.demand);
    }
  }
  for (const auto& [rank, cap] : FusedStagingCaps(*plans)) {
    demand.staging[rank].push_back(StagingNeed{cap, kBucketsInFlight});
  }
  // Both ends of every pair cut the streams alike: one bucket size for every worker, the
  // admitted one, or without admission the smallest of the workers' --bucket-bytes.
  auto send = [this, gid, plans, members = out.members, options, bucket_bytes](int64_t admitted) {
    const StreamLimits limits = StreamLimitsFor(admitted > 0 ? admitted : bucket_bytes);
    const FusedExchangeStats stats = FusedExchange(*plans, limits);
    {
      absl::MutexLock lock(&mu_);
      auto it = groups_.find(gid);
      if (it == groups_.end()) return;
      it->second.bucket_bytes = limits.bucket_bytes;
      it->second.buckets = stats.messages;
    }
    SendGroup(gid, members, options);
  };
  if (absl::Status s = AdmitAndSend(absl::StrCat("group ", gid), ids, send, std::move(demand), gid);
      !s.ok()) {
    // Refused before anything was sent: the group changes nothing.
    for (const StartedPlan& m : out.members) Discard(m.id);
    absl::MutexLock lock(&mu_);
    groups_.erase(gid);
    return s;
  }
  {
    // As started, with what admission decided (buckets are known once admitted).
    absl::MutexLock lock(&mu_);
    if (auto it = groups_.find(gid); it != groups_.end()) {
      out.bucket_bytes = it->second.bucket_bytes;
      out.buckets = it->second.buckets;
    }
    for (StartedPlan& m : out.members) {
      auto it = plans_.find(m.id);
      if (it == plans_.end()) continue;
      m.progress.bucket_bytes = it->second.bucket_bytes;
      m.progress.waiting_for_memory = it->second.waiting_for_memory;
    }
  }
  return out;
}

void PlanManager::SendGroup(const std::string& gid, const std::vector<StartedPlan>& members,
                            const std::vector<FragmentMemberOptions>& options) {
  std::vector<const Plan*> plans;
  plans.reserve(members.size());
  for (const StartedPlan& m : members) plans.push_back(m.plan.get());
  FragmentOptions go;
  go.plan_id = gid;
  go.fused = true;
  go.step_timeout_ms = absl::ToInt64Milliseconds(options_.step_timeout);
  std::vector<std::pair<WorkerEndpoint, int64_t>> endpoints;  // (worker, rank)
  {
    absl::MutexLock lock(&mu_);
    auto git = groups_.find(gid);
    if (git == groups_.end() || git->second.failed) return;
    Group& g = git->second;
    go.communicator_prefix = g.communicator_prefix;
    go.bucket_bytes = g.bucket_bytes;
    // The group's workers: every member's participants, expecting what they all receive.
    for (const std::string& id : g.members) {
      const Entry& e = plans_.at(id);
      for (const auto& [r, p] : e.participants) {
        Participant& gp = g.participants[r];
        gp.endpoint = p.endpoint;
        gp.bytes_expected += p.bytes_expected;
      }
    }
    for (const auto& [r, p] : g.participants) {
      go.incarnations[r] = p.endpoint.incarnation;
      endpoints.emplace_back(p.endpoint, r);
    }
    // Members' entries stay put (and are not retired) until they end, with the group.
    g.entries.reserve(g.members.size());
    for (const std::string& id : g.members) g.entries.push_back(&plans_.at(id));
    g.sent = true;
    g.timer = timer_->Schedule(g.start + options_.plan_timeout, [this, gid] {
      std::string reason;
      {
        absl::MutexLock lock(&mu_);
        auto it = groups_.find(gid);
        if (it == groups_.end()) return;
        const Group& pg = it->second;
        reason = absl::StrCat("group ", gid, " timed out after ",
                              absl::FormatDuration(options_.plan_timeout), " in state ",
                              PlanStateName(pg.state), "; waiting for ", Waiting(pg.participants));
      }
      AbortGroup(gid, reason);
    });
  }
  std::map<int64_t, Fragment> fragments = MakeFragments(plans, options, go);
  for (const auto& [endpoint, rank] : endpoints) {
    const int64_t r = rank;
    client_->Execute(endpoint, FragmentToProto(fragments[rank]),
                     [this, gid, r](absl::Status s) { OnGroupExecuteDone(gid, r, s); });
  }
}

std::vector<std::pair<PlanManager::WatchFn, PlanProgress>> PlanManager::MembersToLocked(
    const Group& g, PlanState state) {
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  for (Entry* member : g.entries) {
    Entry& e = *member;
    if (e.state_ended() || static_cast<int>(e.state) >= static_cast<int>(state)) continue;
    e.state = state;
    if (state == PlanState::kTransferred) e.transferred = g.transferred;
    for (auto& c : ChangedLocked(e)) calls.push_back(std::move(c));
  }
  return calls;
}

void PlanManager::OnGroupExecuteDone(const std::string& gid, int64_t rank,
                                     const absl::Status& status) {
  std::string abort_reason;
  bool validate = false;
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(gid);
    if (it == groups_.end()) return;
    Group& g = it->second;
    if (g.failed || g.closing || g.over) return;
    Participant& p = g.participants.at(rank);
    if (!status.ok()) {
      abort_reason =
          absl::StrCat(Describe(p.endpoint), " could not start its fragment: ", status.ToString());
    } else if (!p.executed) {
      p.executed = true;
      ++g.executed;
      const int64_t n = static_cast<int64_t>(g.participants.size());
      if (g.executed == n && g.state == PlanState::kPending) {
        g.state = PlanState::kPrepared;
        calls = MembersToLocked(g, PlanState::kPrepared);
      }
      if (g.executed == n && g.reported == n && g.failing.empty()) {
        g.state = PlanState::kTransferred;
        g.transferred = clock_->Now();
        for (auto& c : MembersToLocked(g, PlanState::kTransferred)) calls.push_back(std::move(c));
        validate = true;
      }
    }
  }
  if (!abort_reason.empty()) return AbortGroup(gid, abort_reason);
  Tell(calls);
  if (validate) ValidateGroup(gid);
}

absl::StatusOr<PlanManager::Participant*> PlanManager::Reporter(
    std::map<int64_t, Participant>& participants, const WorkerReport& report,
    const std::string& plan_id) {
  auto pit = participants.find(report.rank);
  if (pit == participants.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", report.rank, " takes no part in plan ", plan_id));
  }
  Participant& p = pit->second;
  if (p.endpoint.name != report.worker || p.endpoint.incarnation != report.incarnation) {
    return absl::AbortedError(
        absl::StrCat("report for rank ", report.rank, " from worker ", report.worker,
                     " incarnation ", report.incarnation, " is stale: plan ", plan_id,
                     " runs with ", Describe(p.endpoint), " incarnation ", p.endpoint.incarnation));
  }
  if (report.final) {
    p.timing = report.timing;
    p.timing.set_rank(report.rank);
    p.timing.set_worker(report.worker);
    p.timing.set_error(report.error);
  }
  return &p;
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

void PlanManager::StartGrace(const std::string& id, bool group) {
  const Timer::Id t = timer_->Schedule(clock_->Now() + options_.failure_grace, [this, id, group] {
    std::string reason;
    {
      absl::MutexLock lock(&mu_);
      if (group) {
        auto it = groups_.find(id);
        if (it == groups_.end()) return;
        reason = it->second.failing;
      } else {
        auto it = plans_.find(id);
        if (it == plans_.end()) return;
        reason = it->second.failing;
      }
    }
    if (group) return AbortGroup(id, reason);
    Abort(id, reason);
  });
  absl::MutexLock lock(&mu_);
  if (group) {
    if (auto it = groups_.find(id); it != groups_.end()) it->second.grace_timer = t;
  } else if (auto it = plans_.find(id); it != plans_.end()) {
    it->second.grace_timer = t;
  }
}

std::string PlanManager::Waiting(const std::map<int64_t, Participant>& participants) {
  std::vector<std::string> waiting;
  for (const auto& [r, p] : participants) {
    if (!p.executed) {
      waiting.push_back(absl::StrCat(Describe(p.endpoint), " (no answer to Execute)"));
    } else if (!p.reported) {
      waiting.push_back(absl::StrCat(Describe(p.endpoint), " (no final report)"));
    }
  }
  return waiting.empty() ? "validation" : absl::StrJoin(waiting, ", ");
}

absl::Status PlanManager::ReportGroup(const WorkerReport& report) {
  const std::string& gid = report.plan_id;
  std::string abort_reason;
  bool validate = false;
  bool start_grace = false;
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  {
    absl::MutexLock lock(&mu_);
    auto git = groups_.find(gid);
    if (git == groups_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown plan '", gid, "'"));
    }
    Group& g = git->second;
    if (g.failed || g.closing || g.over) {
      return absl::AbortedError(absl::StrCat("plan ", gid, " already ended (",
                                             g.closing ? "committing" : PlanStateName(g.state),
                                             ")"));
    }
    absl::StatusOr<Participant*> reporter = Reporter(g.participants, report, gid);
    if (!reporter.ok()) return reporter.status();
    Participant& p = **reporter;
    if (!report.error.empty()) {
      abort_reason = FailingLocked(p, report, &g.failing, &start_grace);
    } else if (!report.final) {
      p.bytes_done = std::clamp<int64_t>(report.bytes_done, p.bytes_done, p.bytes_expected);
    } else if (!p.reported) {
      p.reported = true;
      ++g.reported;
      p.bytes_done = p.bytes_expected;
      // A shape's chunks are compared with a plan's target for this rank once, however
      // many members share both.
      std::set<std::pair<const Plan*, int32_t>> matched;
      static const RankChunks kNothing;
      for (const WorkerReport::Member& m : report.members) {
        Entry* e = m.index >= 0 && static_cast<size_t>(m.index) < g.entries.size()
                       ? g.entries[m.index]
                       : nullptr;
        auto mp = e != nullptr ? e->participants.find(report.rank)
                               : std::map<int64_t, Participant>::iterator();
        if (e == nullptr || mp == e->participants.end()) {
          abort_reason = absl::StrCat(Describe(p.endpoint), " reported member ", m.index,
                                      ", which it takes no part in");
          break;
        }
        const std::string& label = g.labels[m.index];
        if (m.shape < 0 || static_cast<size_t>(m.shape) >= report.shapes.size()) {
          abort_reason = absl::StrCat(label, ": ", Describe(p.endpoint), " reported shape ",
                                      m.shape, " of ", report.shapes.size());
          break;
        }
        const RankChunks& got = report.shapes[m.shape];
        if (matched.insert({e->plan.get(), m.shape}).second) {
          const RankChunks* planned = e->plan->target.Find(report.rank);
          const RankChunks& want = planned != nullptr ? *planned : kNothing;
          if (got.chunks != want.chunks ||
              (planned != nullptr && got.local_elements != want.local_elements)) {
            abort_reason =
                absl::StrCat(label, ": validation failed: ", Describe(p.endpoint),
                             " reported chunks ", ChunksString(got.chunks),
                             " but the plan's target for it is ", ChunksString(want.chunks));
            break;
          }
        }
        if (m.checksums.size() != got.chunks.size()) {
          abort_reason =
              absl::StrCat(label, ": validation failed: ", Describe(p.endpoint), " reported ",
                           m.checksums.size(), " checksums for ", got.chunks.size(), " chunks");
          break;
        }
        mp->second.reported = true;
        mp->second.checksums = m.checksums;
        mp->second.bytes_done = mp->second.bytes_expected;
      }
      const int64_t n = static_cast<int64_t>(g.participants.size());
      if (abort_reason.empty() && g.executed == n && g.reported == n && g.failing.empty()) {
        g.state = PlanState::kTransferred;
        g.transferred = clock_->Now();
        calls = MembersToLocked(g, PlanState::kTransferred);
        validate = true;
      }
    }
  }
  if (!abort_reason.empty()) {
    AbortGroup(gid, abort_reason);
    return absl::OkStatus();
  }
  if (start_grace) StartGrace(gid, /*group=*/true);
  Tell(calls);
  if (validate) ValidateGroup(gid);
  return absl::OkStatus();
}

absl::StatusOr<LayoutChecksums> PlanManager::CheckMemberReports(const Entry& e) {
  // Each report's chunks were checked against the plan's target as it came in (ReportGroup).
  const Layout& target = e.plan->target;
  LayoutChecksums sums;
  sums.reserve(target.ranks().size());
  for (const RankChunks& rc : target.ranks()) {
    const Participant& p = e.participants.at(rc.rank);
    if (!p.reported) {
      return absl::FailedPreconditionError(absl::StrCat(Describe(p.endpoint),
                                                        " reported nothing of its target chunks ",
                                                        ChunksString(rc.chunks)));
    }
    sums.push_back(p.checksums);
  }
  // Replicas (same box, same partial index) must hold the same bytes.
  if (absl::Status s = CheckReplicaChecksums(
          target, sums, [&e](int64_t rank) { return Describe(e.participants.at(rank).endpoint); });
      !s.ok()) {
    return s;
  }
  return sums;
}

void PlanManager::ValidateGroup(const std::string& gid) {
  std::string failure;
  std::vector<std::pair<std::string, CommitWork>> work;
  std::vector<TensorManager::CommitItem> items;
  Timer::Id timer = 0, grace_timer = 0;
  {
    absl::MutexLock lock(&mu_);
    auto git = groups_.find(gid);
    if (git == groups_.end()) return;
    Group& g = git->second;
    if (g.failed || g.closing || g.over || !g.failing.empty()) return;
    // Reports are complete and no longer change; checking under the lock costs O(chunks).
    std::vector<LayoutChecksums> sums;
    sums.reserve(g.members.size());
    for (size_t i = 0; i < g.entries.size() && failure.empty(); ++i) {
      const Entry& e = *g.entries[i];
      if (e.state_ended()) {
        failure = absl::StrCat(g.labels[i], " ended");
        break;
      }
      absl::StatusOr<LayoutChecksums> checked = CheckMemberReports(e);
      if (!checked.ok()) {
        failure = absl::StrCat(g.labels[i], ": validation failed: ", checked.status().message());
        break;
      }
      sums.push_back(*std::move(checked));
    }
    if (failure.empty()) {
      g.closing = true;  // From here on deaths and timeouts no longer abort it.
      timer = std::exchange(g.timer, 0);
      grace_timer = std::exchange(g.grace_timer, 0);
      work.reserve(g.members.size());
      items.reserve(g.members.size());
      for (size_t i = 0; i < g.entries.size(); ++i) {
        Entry& e = *g.entries[i];
        CommitWork w = BeginCommitLocked(e, std::move(sums[i]));
        items.push_back(TensorManager::CommitItem{w.target_tensor, e.id, w.state});
        work.emplace_back(e.id, std::move(w));
      }
    }
  }
  if (!failure.empty()) return AbortGroup(gid, failure);
  if (timer != 0) timer_->Cancel(timer);
  if (grace_timer != 0) timer_->Cancel(grace_timer);
  if (absl::Status s = tensors_->CommitAll(std::move(items)); !s.ok()) {
    {
      absl::MutexLock lock(&mu_);
      groups_.at(gid).closing = false;
      for (const auto& [id, w] : work) plans_.at(id).closing = false;
    }
    return AbortGroup(gid, absl::StrCat("group commit failed: ", s.message()));
  }
  EndGroupCommit(gid, std::move(work));
}

void PlanManager::EndGroupCommit(const std::string& gid,
                                 std::vector<std::pair<std::string, CommitWork>> work) {
  // Copies' sources were only read: they keep their versions and are free again.
  for (const auto& [id, w] : work) {
    if (w.target_tensor != w.tensor) tensors_->Release(w.tensor, id);
  }
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  std::vector<WorkerEndpoint> finish;
  int64_t held = 0;
  {
    absl::MutexLock lock(&mu_);
    Group& g = groups_.at(gid);
    const absl::Time now = clock_->Now();
    g.state = PlanState::kCommitted;
    g.end = now;
    for (const auto& [id, w] : work) {
      Entry& e = plans_.at(id);
      e.state = PlanState::kCommitted;
      e.end = now;
      for (auto& c : ChangedLocked(e)) calls.push_back(std::move(c));
    }
    for (const auto& [r, p] : g.participants) finish.push_back(p.endpoint);
    // The FinishPlans below hold the group's admission ticket until answered, as a plan's.
    held = g.admission_ticket;
    if (held != 0) ++ticket_holds_[held];
  }
  Tell(calls);
  // The commit is durable: the members complete (the caller is answered) now, as a single
  // plan's (EndCommit). One FinishPlan per worker then drops every member's old version it
  // may hold, without anything waiting for it.
  for (const auto& [id, w] : work) Complete(id, absl::OkStatus());
  std::map<int64_t, v1::FinishPlanRequest> requests;
  for (const auto& [id, w] : work) {
    for (int64_t rank : w.finish_ranks) {
      v1::FinishMember* m = requests[rank].add_members();
      m->set_tensor(w.target_tensor);
      m->set_drop_version(w.old_target_version);
    }
  }
  std::vector<std::pair<WorkerEndpoint, v1::FinishPlanRequest>> live;
  for (const WorkerEndpoint& w : finish) {
    if (!workers_->IsLive(w.rank, w.incarnation)) continue;
    v1::FinishPlanRequest& req = requests[w.rank];
    req.set_plan_id(gid);
    req.set_commit(true);
    req.set_drop_version(-1);
    live.emplace_back(w, std::move(req));
  }
  FinishOnWorkers(std::move(live), held);
}

void PlanManager::AbortGroup(const std::string& gid, const std::string& reason,
                             absl::StatusCode code) {
  std::vector<std::string> aborted;  // Member ids.
  struct Release {
    std::string tensor, target_tensor, id, target_mesh;
  };
  std::vector<Release> releases;
  std::vector<WorkerEndpoint> participants;
  Timer::Id timer = 0, grace_timer = 0;
  int64_t held = 0;
  {
    absl::MutexLock lock(&mu_);
    auto git = groups_.find(gid);
    if (git == groups_.end()) return;
    Group& g = git->second;
    if (g.closing || g.over) return;
    const bool first = !g.failed;
    if (first) {
      g.failed = true;
      g.error = reason;
      g.error_code = code;
      g.state = PlanState::kAborted;
      g.end = clock_->Now();
      timer = std::exchange(g.timer, 0);
      grace_timer = std::exchange(g.grace_timer, 0);
      // Before the tensors are released below, so no later plan reuses this epoch's keys.
      if (g.communicator_prefix == CommPrefixLocked()) ++comm_epoch_;
      if (g.sent) {
        for (const auto& [r, p] : g.participants) participants.push_back(p.endpoint);
        // Until the workers dropped the new buffers, the group's memory stays reserved.
        held = g.admission_ticket;
        if (held != 0) ++ticket_holds_[held];
      }
    }
    const std::string why = absl::StrCat("group ", gid, ": ", g.error);
    for (const std::string& id : g.members) {
      auto it = plans_.find(id);
      if (it == plans_.end() || it->second.state_ended() || it->second.closing) continue;
      Entry& e = it->second;
      e.state = PlanState::kAborted;
      e.error = why;
      e.end = clock_->Now();
      releases.push_back(Release{e.tensor, e.target_tensor, id, e.target_mesh});
      aborted.push_back(id);
    }
  }
  if (timer != 0) timer_->Cancel(timer);
  if (grace_timer != 0) timer_->Cancel(grace_timer);
  // The old layouts were never replaced; the tensors are free again at once.
  for (const Release& r : releases) ReleaseTensors(r.tensor, r.target_tensor, r.id, r.target_mesh);
  v1::FinishPlanRequest req;
  req.set_plan_id(gid);
  req.set_commit(false);
  FinishOnWorkers(req, std::move(participants), held);
  for (size_t i = 0; i < aborted.size(); ++i) {
    const Release& r = releases[i];
    Complete(aborted[i],
             absl::Status(code, absl::StrCat("plan ", r.id, " on tensor '", r.target_tensor, "'",
                                             r.target_tensor == r.tensor
                                                 ? ""
                                                 : absl::StrCat(" (copy of '", r.tensor, "')"),
                                             " aborted: group ", gid, ": ", reason)));
  }
}

void PlanManager::OnMemberDone(const std::string& gid, size_t index, const absl::Status& status,
                               const PlanProgress& progress) {
  GroupDoneCallback done;
  GroupProgress final;
  absl::Status final_status;
  int64_t ticket = 0;
  PlanProgress summary;  // For on_plan_end.
  std::string prefix;
  bool over = false;
  std::vector<std::string> retire;  // The members, once all ended.
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(gid);
    if (it == groups_.end()) return;
    Group& g = it->second;
    g.finals[index] = progress;
    ++g.ended;
    if (!status.ok() && !g.failed) {
      // Members abort only with their group (AbortGroup marks it first).
      g.failed = true;
      g.error_code = status.code() == absl::StatusCode::kResourceExhausted
                         ? absl::StatusCode::kResourceExhausted
                         : absl::StatusCode::kAborted;
      g.error =
          absl::StrCat(index < g.labels.size() ? g.labels[index] : absl::StrCat("member ", index),
                       " failed: ", status.message());
    }
    if (g.ended == g.finals.size()) {
      final.group_id = gid;
      final.state = g.failed ? PlanState::kAborted : PlanState::kCommitted;
      final.error = g.error;
      final.seconds = absl::ToDoubleSeconds(clock_->Now() - g.start);
      final.members.reserve(g.finals.size());
      for (auto& p : g.finals) final.members.push_back(std::move(p).value_or(PlanProgress{}));
      retire = g.members;
      final_status =
          g.failed ? absl::Status(g.error_code, absl::StrCat("group ", gid, " aborted: ", g.error))
                   : absl::OkStatus();
      done = std::move(g.done);
      ticket = std::exchange(g.admission_ticket, 0);
      over = true;
      summary.plan_id = gid;
      summary.tensor = absl::StrCat(g.finals.size(), g.finals.size() == 1 ? " tensor" : " tensors");
      summary.state = final.state;
      summary.error = g.error;
      summary.seconds = final.seconds;
      for (const PlanProgress& m : final.members) summary.bytes_total += m.bytes_total;
      summary.bytes_done = g.failed ? 0 : summary.bytes_total;
      prefix = std::move(g.retired_prefix);  // Complete retired it, once no plan used it.
      g.over = true;
      g.done = nullptr;
      if (g.end == absl::InfiniteFuture()) g.end = clock_->Now();
      ended_groups_.push_back(gid);
      while (ended_groups_.size() > options_.keep_ended_plans) {
        groups_.erase(ended_groups_.front());
        ended_groups_.pop_front();
      }
    }
  }
  // The group's memory goes back once every member ended (and the workers dropped what the
  // commit replaced, or the new buffers of an abort).
  ReleaseTicket(ticket);
  if (over && options_.on_plan_end) options_.on_plan_end(summary, prefix);
  if (done) done(final_status, final);
  if (retire.empty()) return;
  // After the answer: retiring a large group's members frees as many of the oldest kept
  // plans, which costs about as much as their bookkeeping did.
  absl::MutexLock lock(&mu_);
  for (const std::string& id : retire) RetireLocked(id);
}

}  // namespace shardcoord
