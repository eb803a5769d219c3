#include "coordinator/plans/plan_manager.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/plans/plan_manager_internal.h"
#include "sharding/fused_stream.h"
#include "sharding/plan_fragment.h"
#include "sharding/plan_participants.h"

namespace shardcoord {
namespace {

// The op of repair plans (metrics label, and the one op that may use leaving workers).
constexpr char kRepairOp[] = "repair";

// A plan may not start on a worker that is draining: the cluster is about to replace it.
absl::Status LeavingError(const WorkerRecord& w) {
  return absl::UnavailableError(absl::StrCat(
      w.Describe(), " is leaving the cluster (draining); retry once it is replaced or gone"));
}

// The same chunks from the same spec: a plan between such layouts serves both (the plan
// carries its layouts, which the commit stores). Flat specs are not compared: never equal.
bool SameLayout(const Layout& a, const Layout& b) {
  if (a.flat_spec().has_value() || b.flat_spec().has_value()) return false;
  return a == b && a.placements() == b.placements() && a.mesh() == b.mesh();
}

}  // namespace

std::string ChunksString(const std::vector<Chunk>& chunks) {
  std::vector<std::string> parts;
  for (const Chunk& c : chunks) {
    parts.push_back(absl::StrCat(c.box.ToString(), "@", c.local_offset,
                                 c.partial_index ? absl::StrCat("p", c.partial_index) : ""));
  }
  return absl::StrCat("{", absl::StrJoin(parts, " "), "}");
}

std::string PlanStateName(PlanState state) {
  switch (state) {
    case PlanState::kPending:
      return "PENDING";
    case PlanState::kPrepared:
      return "PREPARED";
    case PlanState::kTransferred:
      return "TRANSFERRED";
    case PlanState::kCommitted:
      return "COMMITTED";
    case PlanState::kAborted:
      return "ABORTED";
  }
  return "UNKNOWN";
}

PlanManager::PlanManager(const Clock* clock, Timer* timer, WorkerManager* workers,
                         MeshManager* meshes, TensorManager* tensors, WorkerClient* client,
                         PlanManagerOptions options)
    : clock_(clock),
      timer_(timer),
      workers_(workers),
      meshes_(meshes),
      tensors_(tensors),
      client_(client),
      options_(std::move(options)),
      cache_(options_.cache_capacity) {}

PlanManager::~PlanManager() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : plans_) {
    if (!e.state_ended()) {
      if (e.timer != 0) timer_->Cancel(e.timer);
      if (e.grace_timer != 0) timer_->Cancel(e.grace_timer);
    }
  }
  for (auto& [id, g] : groups_) {
    if (g.timer != 0) timer_->Cancel(g.timer);
    if (g.grace_timer != 0) timer_->Cancel(g.grace_timer);
  }
}

LivenessFn PlanManager::Liveness() const {
  return [workers = workers_](int64_t rank, int64_t incarnation) {
    return workers->IsLive(rank, incarnation);
  };
}

PlanManager::WorkerView PlanManager::ViewWorkers() const {
  WorkerView view;
  view.workers = workers_->List();
  view.hosts = HostsOf(view.workers);
  return view;
}

absl::StatusOr<const WorkerRecord*> PlanManager::WorkerView::ByRank(int64_t rank) const {
  return WorkerOfRank(workers, rank);
}

LivenessFn PlanManager::WorkerView::Liveness() const {
  return [this](int64_t rank, int64_t incarnation) { return IsLiveIn(workers, rank, incarnation); };
}

// ---- Planning ----------------------------------------------------------------------------

absl::StatusOr<PlanManager::Target> PlanManager::ResolveSpec(const TensorRecord& tensor,
                                                             const Spec& spec) const {
  const std::string mesh_name = spec.mesh.empty() ? tensor.mesh : spec.mesh;
  if (mesh_name.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("target.mesh: tensor '", tensor.name,
                                                   "' is on no mesh; name the target mesh"));
  }
  absl::StatusOr<MeshRecord> mesh = meshes_->Get(mesh_name);
  if (!mesh.ok()) return mesh.status();
  absl::StatusOr<Layout> layout = LayoutForSpec(spec, mesh->mesh, tensor.shape, "target");
  if (!layout.ok()) return layout.status();
  return Target{*std::move(layout), mesh_name, spec.ToString()};
}

absl::StatusOr<std::shared_ptr<const Plan>> PlanManager::MakePlan(const TensorRecord& tensor,
                                                                  const Layout& source,
                                                                  const Layout& target,
                                                                  std::vector<std::string> hosts) {
  PlanOptions options;
  options.hosts_by_rank = std::move(hosts);
  options.cost = options_.cost;
  options.use_collectives = options_.use_collectives;
  absl::StatusOr<std::shared_ptr<const Plan>> plan;
  {
    absl::MutexLock lock(&cache_mu_);
    plan = cache_.GetOrPlan(source, target, tensor.dtype, options);
  }
  if (!plan.ok()) {
    return absl::Status(plan.status().code(),
                        absl::StrCat("planning '", tensor.name, "': ", plan.status().message()));
  }
  return plan;
}

absl::StatusOr<StartedPlan> PlanManager::DryRun(const std::string& tensor, const Spec& spec) {
  absl::StatusOr<TensorRecord> rec = tensors_->Get(tensor);
  if (!rec.ok()) return rec.status();
  absl::StatusOr<Target> target = ResolveSpec(*rec, spec);
  if (!target.ok()) return target.status();
  absl::StatusOr<Layout> source = LiveLayout(*rec, Liveness());
  if (!source.ok()) return source.status();
  absl::StatusOr<std::shared_ptr<const Plan>> plan =
      MakePlan(*rec, *source, target->layout, workers_->HostsByRank());
  if (!plan.ok()) return plan.status();
  StartedPlan out;
  out.tensor = tensor;
  out.plan = *std::move(plan);
  out.progress.tensor = tensor;
  out.progress.bytes_total = out.plan->bytes_moved;
  return out;
}

absl::StatusOr<StartedPlan> PlanManager::Redistribute(const std::string& tensor, const Spec& spec,
                                                      DoneCallback done) {
  return Start(
      "redistribute", tensor, tensor,
      [this, &spec](const TensorRecord& rec) { return ResolveSpec(rec, spec); }, std::move(done));
}

absl::StatusOr<StartedPlan> PlanManager::Repair(const std::string& tensor, DoneCallback done) {
  return Start(
      kRepairOp, tensor, tensor,
      [](const TensorRecord& rec) -> absl::StatusOr<Target> {
        return Target{rec.layout, rec.mesh, rec.spec};
      },
      std::move(done));
}

size_t PlanManager::RunningPlansCount() const {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [id, e] : plans_) n += e.state_ended() ? 0 : 1;
  return n;
}

std::vector<std::string> PlanManager::RunningPlansOf(int64_t rank) const {
  std::vector<std::string> ids;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : plans_) {
    if (!e.state_ended() && e.participants.count(rank) > 0) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<PlanManager::Target> PlanManager::GatherTarget(
    const TensorRecord& rec, const std::string& mesh, std::optional<int64_t> to_rank) const {
  if (to_rank.has_value()) {
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(*to_rank);
    if (!w.ok()) return w.status();
    RankChunks rc;
    rc.rank = *to_rank;
    rc.chunks.push_back(Chunk{Box::Whole(rec.shape), 0, 0});
    rc.local_elements = Box::Whole(rec.shape).Volume();
    absl::StatusOr<Layout> layout = Layout::FromChunks(rec.shape, {std::move(rc)});
    if (!layout.ok()) return layout.status();
    return Target{*std::move(layout), "", absl::StrCat("rank ", *to_rank)};
  }
  absl::StatusOr<MeshRecord> m = meshes_->Get(mesh.empty() ? rec.mesh : mesh);
  if (!m.ok()) {
    if (mesh.empty() && rec.mesh.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh: tensor '", rec.name, "' is on no mesh; name the mesh to gather to"));
    }
    return m.status();
  }
  Spec spec;
  spec.mesh = m->name;
  spec.placements.assign(m->mesh.ndim(), Placement::Replicate());
  return ResolveSpec(rec, spec);
}

absl::StatusOr<StartedPlan> PlanManager::Gather(const std::string& tensor, const std::string& mesh,
                                                std::optional<int64_t> to_rank, DoneCallback done) {
  return Start(
      "gather", tensor, tensor,
      [&](const TensorRecord& rec) { return GatherTarget(rec, mesh, to_rank); }, std::move(done));
}

absl::StatusOr<StartedPlan> PlanManager::Copy(const std::string& src, const std::string& dst,
                                              DoneCallback done) {
  if (src == dst) {
    return absl::InvalidArgumentError(
        absl::StrCat("dst: '", dst, "' is also src; a tensor cannot be copied onto itself"));
  }
  // dst keeps its layout: the target is its committed layout, on its mesh.
  return Start(
      "copy", src, dst,
      [](const TensorRecord& rec) -> absl::StatusOr<Target> {
        return Target{rec.layout, rec.mesh, rec.spec};
      },
      std::move(done));
}

absl::Status PlanManager::CheckCopyable(const TensorRecord& src, const TensorRecord& dst) {
  if (src.shape != dst.shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "dst: tensor '", dst.name, "' has shape [", absl::StrJoin(dst.shape, ", "), "] but src '",
        src.name, "' has shape [", absl::StrJoin(src.shape, ", "), "]"));
  }
  if (src.dtype != dst.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("dst: tensor '", dst.name, "' has dtype ",
                                                   DTypeName(dst.dtype), " but src '", src.name,
                                                   "' has dtype ", DTypeName(src.dtype)));
  }
  return absl::OkStatus();
}

absl::StatusOr<StartedPlan> PlanManager::Start(const char* op, const std::string& tensor,
                                               const std::string& target_tensor,
                                               const TargetFn& target_fn, DoneCallback done,
                                               const std::string& group, FusedMember* fused,
                                               const std::string& owner) {
  const bool copy = target_tensor != tensor;
  const bool repair = absl::string_view(op) == kRepairOp;
  absl::StatusOr<TensorRecord> current = tensors_->Get(tensor, owner);
  if (!current.ok()) return current.status();
  // A Copy's target's record; otherwise the tensor's own serves (not copied: a group starts
  // a member per tensor).
  std::optional<TensorRecord> copy_dst;
  if (copy) {
    absl::StatusOr<TensorRecord> got = tensors_->Get(target_tensor, owner);
    if (!got.ok()) return got.status();
    copy_dst = *std::move(got);
    if (absl::Status s = CheckCopyable(*current, *copy_dst); !s.ok()) return s;
  }
  const TensorRecord& current_dst = copy ? *copy_dst : *current;
  absl::StatusOr<Target> target = target_fn(current_dst);
  if (!target.ok()) return target.status();
  std::optional<WorkerView> own_view;
  if (fused == nullptr || fused->workers == nullptr) own_view = ViewWorkers();
  const WorkerView& view = own_view.has_value() ? *own_view : *fused->workers;
  for (const RankChunks& rc : target->layout.ranks()) {
    absl::StatusOr<const WorkerRecord*> w = view.ByRank(rc.rank);
    if (!w.ok()) return w.status();
    if (!(*w)->alive) return (*w)->DeadError("in the target layout is dead");
    if ((*w)->leaving && !repair) return LeavingError(**w);
  }

  std::string id, prefix;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.empty()) return absl::UnavailableError(closed_);
    id = options_.id_namespace.empty()
             ? absl::StrCat("p-", next_plan_++)
             : absl::StrCat("p-", options_.id_namespace, ".", next_plan_++);
    prefix = fused != nullptr ? fused->communicator_prefix : CommPrefixLocked();
  }
  // The target tensor counts as a user of the target mesh; a Copy's source only reads.
  absl::StatusOr<TensorRecord> rec = tensors_->Acquire(tensor, id, copy ? "" : target->mesh, owner);
  if (!rec.ok()) return rec.status();
  std::optional<TensorRecord> acquired_dst;  // As copy_dst.
  if (copy) {
    absl::StatusOr<TensorRecord> got = tensors_->Acquire(target_tensor, id, target->mesh, owner);
    if (!got.ok()) {
      tensors_->Release(tensor, id);
      return got.status();
    }
    acquired_dst = *std::move(got);
  }
  const TensorRecord& dst_rec = copy ? *acquired_dst : *rec;
  auto fail = [&](absl::Status s) {
    ReleaseTensors(tensor, target_tensor, id, target->mesh);
    return s;
  };
  if (rec->shape != target->layout.global_shape()) {
    return fail(absl::AbortedError(absl::StrCat("tensor '", tensor, "' changed shape")));
  }
  if (copy) {
    // The target was dst's layout when looked up; a plan that committed since moved it.
    if (dst_rec.version != current_dst.version) {
      return fail(absl::AbortedError(
          absl::StrCat("tensor '", target_tensor, "' changed while the copy was planned")));
    }
    if (absl::Status s = CheckCopyable(*rec, dst_rec); !s.ok()) return fail(s);
    if (dst_rec.attached) {
      // Written in place: every rank's lent buffer must be there.
      std::vector<int64_t> missing(dst_rec.unattached.begin(), dst_rec.unattached.end());
      for (const LostChunk& c : LostChunks(dst_rec, view.Liveness())) {
        missing.insert(missing.end(), c.ranks.begin(), c.ranks.end());
      }
      std::sort(missing.begin(), missing.end());
      missing.erase(std::unique(missing.begin(), missing.end()), missing.end());
      if (!missing.empty()) {
        return fail(absl::FailedPreconditionError(absl::StrCat(
            "dst: tensor '", target_tensor, "' is attached but rank",
            missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
            " has no buffer attached (attach ", missing.size() > 1 ? "them" : "it", " first)")));
      }
    }
  }
  absl::StatusOr<Layout> source = LiveLayout(*rec, view.Liveness());
  if (!source.ok()) return fail(source.status());
  GroupMemo* const memo = fused != nullptr ? fused->memo : nullptr;
  std::optional<std::shared_ptr<const Plan>> plan;  // Set from here on.
  if (memo != nullptr && memo->plan != nullptr && memo->dtype == rec->dtype &&
      SameLayout(memo->source, *source) && SameLayout(memo->target, target->layout)) {
    plan = memo->plan;  // The previous member's: same inputs, same plan.
  } else {
    absl::StatusOr<std::shared_ptr<const Plan>> made =
        MakePlan(*rec, *source, target->layout, view.hosts);
    if (!made.ok()) return fail(made.status());
    plan = *std::move(made);
    if (memo != nullptr) {
      memo->plan = *plan;
      memo->dtype = rec->dtype;
      memo->source = *std::move(source);
      memo->target = target->layout;
      memo->participants = PlanParticipants(**plan);
    }
  }

  Entry e;
  e.id = id;
  e.op = op;
  e.group = group;
  e.owner = owner;
  e.tensor = tensor;
  e.target_tensor = target_tensor;
  e.plan = *plan;
  e.target_mesh = target->mesh;
  e.target_spec = target->spec;
  e.source_version = rec->version;
  e.target_version = tensors_->NewVersion();
  e.old_target_version = dst_rec.version;
  e.target_attached = copy && dst_rec.attached;
  e.communicator_prefix = prefix;
  // A new buffer on every target rank unless written in place; the version it replaces
  // (the target tensor's committed one) is freed at commit.
  // A group member's staging is its group's fused fragment's (StartGroup).
  if (memo == nullptr) {
    e.demand =
        PlanMemoryDemand(**plan, e.target_attached, e.target_attached ? nullptr : &dst_rec.layout,
                         /*staging=*/fused == nullptr);
  } else {
    if (memo->demand_plan != plan->get() || memo->in_place != e.target_attached ||
        (!e.target_attached && !SameLayout(memo->replaced, dst_rec.layout))) {
      memo->demand =
          PlanMemoryDemand(**plan, e.target_attached, e.target_attached ? nullptr : &dst_rec.layout,
                           /*staging=*/false);
      memo->demand_plan = plan->get();
      memo->in_place = e.target_attached;
      if (!e.target_attached) memo->replaced = dst_rec.layout;
    }
    e.demand = memo->demand;
  }
  // A tiny plain copy moves faster through the coordinator than through a fragment on every
  // worker (plan_relay.h); a group member always runs in its group's fused plan.
  e.relay = fused == nullptr && !repair &&
            RelayEligible(**plan, e.target_attached, options_.relay_max_bytes);
  FragmentOptions fo;
  fo.plan_id = id;
  FragmentMemberOptions member;
  member.plan_id = id;
  member.tensor = tensor;
  member.target_tensor = target_tensor;
  member.source_version = e.source_version;
  member.target_version = e.target_version;
  fo.step_timeout_ms = absl::ToInt64Milliseconds(options_.step_timeout);
  fo.communicator_prefix = e.communicator_prefix;
  if (e.target_attached) member.attached_target_version = dst_rec.version;
  int64_t bucket_bytes = 0;
  std::vector<int64_t> own_participants;
  const std::vector<int64_t>& participants =
      memo != nullptr ? memo->participants : (own_participants = PlanParticipants(**plan));
  for (int64_t r : participants) {
    absl::StatusOr<const WorkerRecord*> found = view.ByRank(r);
    if (!found.ok()) return fail(found.status());
    const WorkerRecord& w = **found;
    if (!w.alive) return fail(w.DeadError("takes part in the plan but is dead"));
    if (w.leaving && !repair) return fail(LeavingError(w));
    Participant& p = e.participants[r];
    p.endpoint = w.Endpoint();
    fo.incarnations[r] = w.incarnation;
    const int64_t b = w.spec.bucket_bytes > 0 ? w.spec.bucket_bytes : kDefaultBucketBytes;
    bucket_bytes = bucket_bytes == 0 ? b : std::min(bucket_bytes, b);
  }
  for (const RankTraffic& t : (*plan)->traffic) {
    auto it = e.participants.find(t.rank);
    if (it != e.participants.end()) it->second.bytes_expected = t.bytes_received;
  }
  for (const RankChunks& rc : (*plan)->target.ranks()) {
    if (e.participants.count(rc.rank) == 0) e.relay = false;  // Each target rank reports.
  }
  Dispatch fragments;
  if (fused == nullptr) {
    const Plan* plans[] = {plan->get()};
    std::map<int64_t, Fragment> made;
    if (!e.relay) made = MakeFragments(plans, {member}, fo);
    for (const auto& [r, p] : e.participants) {
      if (!e.relay) fragments.emplace_back(p.endpoint, FragmentToProto(made.at(r)));
    }
  } else {
    fused->options.plan_id = id;
    fused->options.tensor = tensor;
    fused->options.target_tensor = target_tensor;
    fused->options.source_version = e.source_version;
    fused->options.target_version = e.target_version;
    fused->options.attached_target_version = member.attached_target_version;
    fused->bucket_bytes = bucket_bytes;
  }

  const absl::Time now = clock_->Now();
  e.start = now;
  if (done) e.done.push_back(std::move(done));
  // A group member is timed by its group.
  if (fused == nullptr) {
    e.timer = timer_->Schedule(now + options_.plan_timeout, [this, id] {
      std::string reason;
      {
        absl::MutexLock lock(&mu_);
        auto it = plans_.find(id);
        if (it == plans_.end()) return;
        const Entry& pe = it->second;
        reason = absl::StrCat("timed out after ", absl::FormatDuration(options_.plan_timeout),
                              " in state ", PlanStateName(pe.state), "; waiting for ",
                              Waiting(pe.participants));
      }
      Abort(id, reason);
    });
  }

  StartedPlan out;
  out.id = id;
  out.tensor = target_tensor;
  out.plan = *plan;
  out.target_version = e.target_version;
  {
    absl::MutexLock lock(&mu_);
    Entry& stored = plans_[id] = std::move(e);
    out.progress = ProgressLocked(stored);
  }
  if (fused != nullptr) return out;  // The group admits and sends it.
  MemoryDemand demand;
  bool relay = false;
  {
    absl::MutexLock lock(&mu_);
    demand = plans_.at(id).demand;
    relay = plans_.at(id).relay;
  }
  auto dispatch = std::make_shared<Dispatch>(std::move(fragments));
  auto send = [this, id, dispatch, relay](int64_t bucket) {
    if (relay) return Relay(id);
    if (bucket > 0) {
      for (auto& [endpoint, fragment] : *dispatch) fragment.set_bucket_bytes(bucket);
    }
    Send(id, std::move(*dispatch));
  };
  if (absl::Status s = AdmitAndSend(absl::StrCat("plan ", id), {id}, send, std::move(demand));
      !s.ok()) {
    Discard(id);  // Nothing was sent.
    return s;
  }
  {
    // The progress as started (PENDING), with what admission decided.
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it != plans_.end()) {
      out.progress.bucket_bytes = it->second.bucket_bytes;
      out.progress.waiting_for_memory = it->second.waiting_for_memory;
    }
  }
  return out;
}

absl::Status PlanManager::AdmitAndSend(const std::string& what, const std::vector<std::string>& ids,
                                       std::function<void(int64_t bucket_bytes)> send,
                                       MemoryDemand demand, const std::string& group) {
  if (options_.admission == nullptr) {
    send(0);
    return absl::OkStatus();
  }
  auto admitted = [this, ids, send](int64_t bucket) {
    std::vector<std::pair<WatchFn, PlanProgress>> calls;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& id : ids) {
        auto it = plans_.find(id);
        if (it == plans_.end() || it->second.state_ended()) continue;
        it->second.bucket_bytes = bucket;
        it->second.waiting_for_memory.clear();
        for (auto& call : ChangedLocked(it->second)) calls.push_back(std::move(call));
      }
    }
    Tell(calls);
    send(bucket);
  };
  auto refuse = [this, ids, group](const absl::Status& s) {
    if (!group.empty()) return AbortGroup(group, std::string(s.message()), s.code());
    for (const std::string& id : ids) AbortWith(id, std::string(s.message()), s.code());
  };
  absl::StatusOr<AdmissionController::Grant> grant =
      options_.admission->Request(what, std::move(demand), /*may_wait=*/true, admitted, refuse);
  if (!grant.ok()) return grant.status();
  // The ticket is the plan's (or the group's) until it ends; if it ended already (a
  // refusal, or an admitted plan that ran to its end meanwhile), it goes now.
  bool release = false;
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  {
    absl::MutexLock lock(&mu_);
    if (!group.empty()) {
      auto g = groups_.find(group);
      if (g != groups_.end() && !g->second.over) {
        g->second.admission_ticket = grant->ticket;
      } else {
        release = true;
      }
    } else {
      auto it = plans_.find(ids.front());
      if (it != plans_.end() && !it->second.completed) {
        it->second.admission_ticket = grant->ticket;
      } else {
        release = true;
      }
    }
    if (!grant->admitted) {
      for (const std::string& id : ids) {
        auto it = plans_.find(id);
        if (it == plans_.end() || it->second.state_ended() || it->second.bucket_bytes > 0) {
          continue;  // Ended, or admitted meanwhile.
        }
        it->second.waiting_for_memory = grant->waiting;
        for (auto& call : ChangedLocked(it->second)) calls.push_back(std::move(call));
      }
    }
  }
  if (release) options_.admission->Release(grant->ticket);
  Tell(calls);
  if (grant->admitted) admitted(grant->bucket_bytes);
  return absl::OkStatus();
}

void PlanManager::Send(const std::string& id, Dispatch fragments) {
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.state_ended()) return;  // A group member aborted.
  }
  for (auto& [endpoint, fragment] : fragments) {
    const int64_t rank = endpoint.rank;
    client_->Execute(endpoint, std::move(fragment),
                     [this, id, rank](absl::Status s) { OnExecuteDone(id, rank, s); });
  }
}

void PlanManager::Relay(const std::string& id) {
  RelayRequest q;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.state_ended()) return;
    const Entry& e = it->second;
    q.plan_id = id;
    q.tensor = e.tensor;
    q.source_version = e.source_version;
    q.target_tensor = e.target_tensor;
    q.target_version = e.target_version;
    q.dtype = e.plan->dtype;
    q.source = e.plan->source;
    q.target = e.plan->target;
    for (const auto& [r, p] : e.participants) q.workers[r] = p.endpoint;
  }
  // A holder the relay reads from may have no part in the plan's own transfers.
  for (const RankChunks& rc : q.source.ranks()) {
    if (q.workers.count(rc.rank) > 0) continue;
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
    if (!w.ok()) return Abort(id, std::string(w.status().message()));
    if (!w->alive) return Abort(id, std::string(w->DeadError("holds a source chunk").message()));
    q.workers[rc.rank] = w->Endpoint();
  }
  std::map<int64_t, WorkerEndpoint> workers = q.workers;
  RunRelay(client_, std::move(q),
           [this, id, workers](RelayResult r) { OnRelayDone(id, workers, std::move(r)); });
}

void PlanManager::OnRelayDone(const std::string& id,
                              const std::map<int64_t, WorkerEndpoint>& workers,
                              RelayResult result) {
  std::string abort_reason;
  bool drop = false, validate = false;
  std::string target_tensor;
  int64_t target_version = 0;
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end()) return;
    Entry& e = it->second;
    target_tensor = e.target_tensor;
    target_version = e.target_version;
    if (e.state_ended() || e.closing) {
      drop = true;  // Aborted meanwhile (a timeout, a death): what was written goes.
    } else if (!result.status.ok()) {
      drop = true;
      abort_reason = absl::StrCat("relay failed: ", result.status.message());
    } else {
      // The workers' answers are their reports: every participant ran and reported.
      for (auto& [r, p] : e.participants) {
        p.executed = true;
        p.reported = true;
        p.bytes_done = p.bytes_expected;
        p.timing.set_rank(r);
        p.timing.set_worker(p.endpoint.name);
        auto w = result.written.find(r);
        if (w == result.written.end()) {
          // Only read from: no buffer of the new version.
          p.chunks = RankChunks{};
          p.chunks.rank = r;
          p.checksums.clear();
          p.timing.set_start_unix_us(absl::ToUnixMicros(result.reads_done));
          p.timing.set_end_unix_us(absl::ToUnixMicros(result.reads_done));
          continue;
        }
        p.chunks = w->second.chunks;
        p.checksums = w->second.checksums;
        p.timing.set_start_unix_us(absl::ToUnixMicros(w->second.start));
        p.timing.set_end_unix_us(absl::ToUnixMicros(w->second.end));
        v1::StepTiming* t = p.timing.add_steps();
        t->set_op("relay_write");
        t->set_start_unix_us(absl::ToUnixMicros(w->second.start));
        t->set_duration_us(absl::ToInt64Microseconds(w->second.end - w->second.start));
        t->set_bytes_received(w->second.bytes);
      }
      e.executed = e.reported = static_cast<int64_t>(e.participants.size());
      e.state = PlanState::kTransferred;
      e.transferred = clock_->Now();
      validate = true;
      calls = ChangedLocked(e);
    }
  }
  if (drop) {
    // The new version is this plan's alone: dropping it never touches another's.
    v1::DropTensorRequest req;
    req.set_tensor(target_tensor);
    req.set_version(target_version);
    for (int64_t r : result.attempted) {
      auto w = workers.find(r);
      if (w != workers.end()) client_->DropTensor(w->second, req, [](absl::Status) {});
    }
  }
  if (!abort_reason.empty()) return Abort(id, abort_reason);
  Tell(calls);
  if (validate) Validate(id);
}

void PlanManager::Discard(const std::string& id) {
  std::string tensor, target_tensor, target_mesh;
  Timer::Id timer = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end()) return;
    const Entry& e = it->second;
    tensor = e.tensor;
    target_tensor = e.target_tensor;
    target_mesh = e.target_mesh;
    timer = e.timer;
    plans_.erase(it);
  }
  if (timer != 0) timer_->Cancel(timer);
  ReleaseTensors(tensor, target_tensor, id, target_mesh);
}

// ---- Progress and watchers ---------------------------------------------------------------

PlanProgress PlanManager::ProgressLocked(const Entry& e) const {
  PlanProgress p;
  p.plan_id = e.id;
  p.tensor = e.target_tensor;
  p.state = e.state;
  p.bytes_total = e.plan->bytes_moved;
  for (const auto& [r, part] : e.participants) p.bytes_done += part.bytes_done;
  if (e.state == PlanState::kCommitted) p.bytes_done = p.bytes_total;
  p.bytes_done = std::min(p.bytes_done, p.bytes_total);
  p.error = e.error;
  const absl::Time end = e.end == absl::InfiniteFuture() ? clock_->Now() : e.end;
  p.seconds = absl::ToDoubleSeconds(end - e.start);
  p.seq = e.seq;
  p.bucket_bytes = e.bucket_bytes;
  p.waiting_for_memory = e.waiting_for_memory;
  return p;
}

std::vector<std::pair<PlanManager::WatchFn, PlanProgress>> PlanManager::ChangedLocked(Entry& e) {
  ++e.seq;
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  if (e.watchers.empty()) return calls;
  const PlanProgress p = ProgressLocked(e);
  for (const auto& [wid, fn] : e.watchers) calls.emplace_back(fn, p);
  return calls;
}

void PlanManager::Tell(const std::vector<std::pair<WatchFn, PlanProgress>>& calls) {
  for (const auto& [fn, p] : calls) {
    // A final update is delivered by Complete, after the done callbacks.
    if (!p.ended()) fn(p);
  }
}

std::string PlanManager::CommPrefixLocked() const {
  if (options_.id_namespace.empty()) return absl::StrCat("shardcoord/comm/", comm_epoch_, "/");
  return absl::StrCat("shardcoord/comm/", options_.id_namespace, ".", comm_epoch_, "/");
}

void PlanManager::RetireLocked(const std::string& id) {
  ended_.push_back(id);
  while (ended_.size() > options_.keep_ended_plans) {
    plans_.erase(ended_.front());
    ended_.pop_front();
  }
}

absl::StatusOr<PlanProgress> PlanManager::Progress(const std::string& plan_id) const {
  absl::MutexLock lock(&mu_);
  auto it = plans_.find(plan_id);
  if (it == plans_.end()) return absl::NotFoundError(absl::StrCat("unknown plan '", plan_id, "'"));
  return ProgressLocked(it->second);
}

absl::StatusOr<int64_t> PlanManager::Watch(const std::string& plan_id, WatchFn fn) {
  PlanProgress now;
  int64_t wid = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(plan_id);
    if (it == plans_.end()) {
      return absl::NotFoundError(absl::StrCat("unknown plan '", plan_id, "'"));
    }
    Entry& e = it->second;
    now = ProgressLocked(e);
    // Registered unless it has completed: a committed plan still waiting on FinishPlan
    // answers gets its final update from Complete.
    if (!e.completed) {
      wid = next_watch_++;
      e.watchers.emplace(wid, fn);
    }
  }
  // The current state first; a completed plan's is final.
  if (wid == 0 || !now.ended()) fn(now);
  return wid;
}

void PlanManager::Unwatch(const std::string& plan_id, int64_t watch_id) {
  absl::MutexLock lock(&mu_);
  auto it = plans_.find(plan_id);
  if (it != plans_.end()) it->second.watchers.erase(watch_id);
}

int64_t PlanManager::cache_hits() const {
  absl::MutexLock lock(&cache_mu_);
  return cache_.hits();
}

int64_t PlanManager::cache_misses() const {
  absl::MutexLock lock(&cache_mu_);
  return cache_.misses();
}

}  // namespace shardcoord