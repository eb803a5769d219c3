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
    item.where = m.where.empty() ? absl::StrCat("tensors[", i, "]") : m.where;
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
      const std::optional<DType> dtype = m.dtype;
      item.target_tensor = m.staging;
      item.target_fn = [this, spec, dtype](const TensorRecord& rec) -> absl::StatusOr<Target> {
        absl::StatusOr<Target> t = ResolveSpec(rec, spec);
        if (t.ok()) t->dtype = dtype;
        return t;
      };
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
    gid = Namespaced("g-", next_group_++);
    prefix = CommPrefixLocked();
    Transaction& t = transactions_[gid];
    t.id = gid;
    t.strategy = Strategy::kFused;
    t.start = clock_->Now();
    t.done = std::move(done);
    t.finals.resize(items.size());
    t.communicator_prefix = prefix;
  }
  StartedGroup out;
  out.id = gid;
  out.members.reserve(items.size());
  int64_t bucket_bytes = 0;
  const WorkerView view = ViewWorkers();
  GroupMemo memo;
  for (size_t i = 0; i < items.size(); ++i) {
    MemberInput input;
    input.txn = gid;
    input.communicator_prefix = prefix;
    input.workers = &view;
    input.memo = &memo;
    input.owner = items[i].owner;
    input.keep_hidden = items[i].keep_hidden;
    absl::StatusOr<StartedMember> started = StartMember(
        items[i].op, items[i].tensor, items[i].target_tensor, items[i].target_fn,
        [this, gid, i](const absl::Status& s, const PlanProgress& p) {
          OnMemberDone(gid, i, s, p);
        },
        input);
    if (!started.ok()) {
      // Nothing was sent: the members started so far are forgotten, their tensors freed.
      for (const StartedPlan& m : out.members) Discard(m.id);
      absl::MutexLock lock(&mu_);
      transactions_.erase(gid);
      return absl::Status(started.status().code(),
                          absl::StrCat(items[i].where, ": ", started.status().message()));
    }
    bucket_bytes =
        bucket_bytes == 0 ? started->bucket_bytes : std::min(bucket_bytes, started->bucket_bytes);
    StartedPlan& plan = started->plan;
    out.bytes_moved += plan.plan->bytes_moved;
    out.lower_bound_bytes += plan.plan->lower_bound_bytes;
    {
      absl::MutexLock lock(&mu_);
      Transaction& t = transactions_.at(gid);
      t.members.push_back(plan.id);
      t.labels.push_back(absl::StrCat(items[i].label, ", plan ", plan.id, ")"));
    }
    out.members.push_back(std::move(plan));
  }
  auto plans = std::make_shared<std::vector<const Plan*>>();
  plans->reserve(out.members.size());
  for (const StartedPlan& m : out.members) plans->push_back(m.plan.get());
  bool failed = false;
  std::string error;
  {
    absl::MutexLock lock(&mu_);
    Transaction& t = transactions_.at(gid);
    t.default_bucket_bytes = bucket_bytes;
    failed = t.failed;
    error = t.error;
  }
  if (failed) {
    // A member was aborted (a worker died) before anything was sent: end the rest unsent.
    AbortTransaction(gid, error);
    return out;
  }
  // The group's memory is admitted as one (all or nothing): every member's new buffers, and
  // one fused fragment's staging per rank.
  MemoryDemand demand;
  {
    absl::MutexLock lock(&mu_);
    for (const StartedPlan& m : out.members) {
      auto it = plans_.find(m.id);
      // A member's demand has no staging (StartMember): the fused fragment stages instead.
      if (it != plans_.end()) demand.Add(it->second.demand);
    }
  }
  for (const auto& [rank, cap] : FusedStagingCaps(*plans)) {
    demand.staging[rank].push_back(StagingNeed{cap, kBucketsInFlight});
  }
  if (absl::Status s = AdmitAndSend(absl::StrCat("group ", gid), gid, std::move(demand)); !s.ok()) {
    // Refused before anything was sent: the group changes nothing.
    for (const StartedPlan& m : out.members) Discard(m.id);
    absl::MutexLock lock(&mu_);
    transactions_.erase(gid);
    return s;
  }
  {
    // As started, with what admission decided (buckets are known once admitted).
    absl::MutexLock lock(&mu_);
    if (auto it = transactions_.find(gid); it != transactions_.end()) {
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
    auto it = transactions_.find(gid);
    if (it == transactions_.end()) return;
    Transaction& g = it->second;
    g.finals[index] = progress;
    ++g.ended;
    if (!status.ok() && !g.failed) {
      // Members abort only with their group (AbortTransaction marks it first).
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
        transactions_.erase(ended_groups_.front());
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
