#include "coordinator/plan_manager.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "sharding/fused_stream.h"

namespace shardcoord {
namespace {

// The op of repair plans (metrics label, and the one op that may use leaving workers).
constexpr char kRepairOp[] = "repair";

// A plan may not start on a worker that is draining: the cluster is about to replace it.
absl::Status LeavingError(const WorkerRecord& w) {
  return absl::UnavailableError(absl::StrCat(
      w.Describe(), " is leaving the cluster (draining); retry once it is replaced or gone"));
}

std::string ChunksString(const std::vector<Chunk>& chunks) {
  std::vector<std::string> parts;
  for (const Chunk& c : chunks) {
    parts.push_back(absl::StrCat(c.box.ToString(), "@", c.local_offset,
                                 c.partial_index ? absl::StrCat("p", c.partial_index) : ""));
  }
  return absl::StrCat("{", absl::StrJoin(parts, " "), "}");
}

// The same chunks from the same spec: a plan between such layouts serves both (the plan
// carries its layouts, which the commit stores). Flat specs are not compared: never equal.
bool SameLayout(const Layout& a, const Layout& b) {
  if (a.flat_spec().has_value() || b.flat_spec().has_value()) return false;
  return a == b && a.placements() == b.placements() && a.mesh() == b.mesh();
}

}  // namespace

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
  fo.tensor = tensor;
  fo.target_tensor = target_tensor;
  fo.source_version = e.source_version;
  fo.target_version = e.target_version;
  fo.step_timeout_ms = absl::ToInt64Milliseconds(options_.step_timeout);
  fo.communicator_prefix = e.communicator_prefix;
  if (e.target_attached) fo.attached_target_version = dst_rec.version;
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
    for (const auto& [r, p] : e.participants) {
      if (!e.relay) fragments.emplace_back(p.endpoint, MakeFragment(**plan, r, fo));
    }
  } else {
    fused->options.plan_id = id;
    fused->options.tensor = tensor;
    fused->options.target_tensor = target_tensor;
    fused->options.source_version = e.source_version;
    fused->options.target_version = e.target_version;
    fused->options.attached_target_version = fo.attached_target_version;
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
  GroupFragmentOptions go;
  go.plan_id = gid;
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
  std::map<int64_t, v1::PlanFragment> fragments = MakeGroupFragments(plans, options, go);
  for (const auto& [endpoint, rank] : endpoints) {
    const int64_t r = rank;
    client_->Execute(endpoint, std::move(fragments[rank]),
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
