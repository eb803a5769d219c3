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
#include "sharding/cast.h"
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
  for (auto& [id, t] : transactions_) {
    if (t.timer != 0) timer_->Cancel(t.timer);
    if (t.grace_timer != 0) timer_->Cancel(t.grace_timer);
  }
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

absl::StatusOr<std::shared_ptr<const Plan>> PlanManager::MakePlan(
    const TensorRecord& tensor, const Layout& source, const Layout& target,
    std::vector<std::string> hosts, std::optional<DType> target_dtype) {
  PlanOptions options;
  options.hosts_by_rank = std::move(hosts);
  options.cost = options_.cost;
  options.use_collectives = options_.use_collectives;
  absl::StatusOr<std::shared_ptr<const Plan>> plan;
  {
    absl::MutexLock lock(&cache_mu_);
    plan = cache_.GetOrPlan(source, target, tensor.dtype, target_dtype.value_or(tensor.dtype),
                            options);
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
  const WorkerView view = ViewWorkers();
  absl::StatusOr<Layout> source = LiveLayout(*rec, view.Liveness());
  if (!source.ok()) return source.status();
  absl::StatusOr<std::shared_ptr<const Plan>> plan =
      MakePlan(*rec, *source, target->layout, view.hosts);
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
  for (const auto& [id, e] : plans_) n += e.ended() ? 0 : 1;
  return n;
}

std::vector<std::string> PlanManager::RunningPlansOf(int64_t rank) const {
  std::vector<std::string> ids;
  absl::MutexLock lock(&mu_);
  for (const auto& [id, e] : plans_) {
    if (!e.ended() && e.participants.count(rank) > 0) ids.push_back(id);
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
  absl::Status s = CheckCopyPair(src.name, src.shape, src.dtype, dst.name, dst.shape, dst.dtype);
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat("dst: ", s.message()));
}

absl::StatusOr<PlanManager::StartedMember> PlanManager::StartMember(
    const char* op, const std::string& tensor, const std::string& target_tensor,
    const TargetFn& target_fn, DoneCallback done, const MemberInput& input) {
  const bool member = !input.txn.empty();
  const std::string& owner = input.owner;
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
  if (input.workers == nullptr) own_view = ViewWorkers();
  const WorkerView& view = own_view.has_value() ? *own_view : *input.workers;
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
    id = Namespaced("p-", next_plan_++);
    prefix = member ? input.communicator_prefix : CommPrefixLocked();
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
  GroupMemo* const memo = input.memo;
  std::optional<std::shared_ptr<const Plan>> plan;  // Set from here on.
  const DType target_dtype = copy ? dst_rec.dtype : target->dtype.value_or(rec->dtype);
  if (memo != nullptr && memo->plan != nullptr && memo->dtype == rec->dtype &&
      memo->target_dtype == target_dtype && SameLayout(memo->source, *source) &&
      SameLayout(memo->target, target->layout)) {
    plan = memo->plan;  // The previous member's: same inputs, same plan.
  } else {
    absl::StatusOr<std::shared_ptr<const Plan>> made =
        MakePlan(*rec, *source, target->layout, view.hosts, target_dtype);
    if (!made.ok()) return fail(made.status());
    plan = *std::move(made);
    if (memo != nullptr) {
      memo->plan = *plan;
      memo->dtype = rec->dtype;
      memo->target_dtype = target_dtype;
      memo->source = *std::move(source);
      memo->target = target->layout;
      memo->participants = PlanParticipants(**plan);
    }
  }

  PlanRecord e;
  e.id = id;
  e.op = op;
  e.txn = member ? input.txn : id;
  e.owner = owner;
  e.keep_hidden = input.keep_hidden;
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
                         /*staging=*/!member, dst_rec.dtype);
  } else {
    if (memo->demand_plan != plan->get() || memo->in_place != e.target_attached ||
        (!e.target_attached && !SameLayout(memo->replaced, dst_rec.layout))) {
      memo->demand =
          PlanMemoryDemand(**plan, e.target_attached, e.target_attached ? nullptr : &dst_rec.layout,
                           /*staging=*/false, dst_rec.dtype);
      memo->demand_plan = plan->get();
      memo->in_place = e.target_attached;
      if (!e.target_attached) memo->replaced = dst_rec.layout;
    }
    e.demand = memo->demand;
  }
  // A tiny plain copy moves faster through the coordinator than through a fragment on every
  // worker (plan_relay.h); a group member always runs in its group's fused plan.
  e.relay =
      !member && !repair && RelayEligible(**plan, e.target_attached, options_.relay_max_bytes);
  StartedMember out;
  std::vector<int64_t> own_participants;
  const std::vector<int64_t>& participants =
      memo != nullptr ? memo->participants : (own_participants = PlanParticipants(**plan));
  for (int64_t r : participants) {
    absl::StatusOr<const WorkerRecord*> found = view.ByRank(r);
    if (!found.ok()) return fail(found.status());
    const WorkerRecord& w = **found;
    if (!w.alive) return fail(w.DeadError("takes part in the plan but is dead"));
    if (w.leaving && !repair) return fail(LeavingError(w));
    e.participants[r].endpoint = w.Endpoint();
    const int64_t b = w.spec.bucket_bytes > 0 ? w.spec.bucket_bytes : kDefaultBucketBytes;
    out.bucket_bytes = out.bucket_bytes == 0 ? b : std::min(out.bucket_bytes, b);
  }
  for (const RankTraffic& t : (*plan)->traffic) {
    auto it = e.participants.find(t.rank);
    if (it != e.participants.end()) it->second.bytes_expected = t.bytes_received;
  }
  for (const RankChunks& rc : (*plan)->target.ranks()) {
    if (e.participants.count(rc.rank) == 0) e.relay = false;  // Each target rank reports.
  }

  e.start = clock_->Now();
  if (done) e.done.push_back(std::move(done));
  out.plan.id = id;
  out.plan.tensor = target_tensor;
  out.plan.plan = *plan;
  out.plan.target_version = e.target_version;
  absl::MutexLock lock(&mu_);
  PlanRecord& stored = plans_[id] = std::move(e);
  out.plan.progress = ProgressLocked(stored);
  if (member) return out;  // Its group admits, times and sends it.
  // A transaction of its own, under its id, timed from now.
  Transaction& t = transactions_[id];
  t.id = id;
  t.strategy = stored.relay ? Strategy::kRelay : Strategy::kCollective;
  t.members = {id};
  t.records = {&stored};
  t.participants = stored.participants;
  t.sent = true;
  t.start = stored.start;
  t.communicator_prefix = prefix;
  t.default_bucket_bytes = out.bucket_bytes;
  t.finals.resize(1);
  ScheduleTimeoutLocked(t);
  return out;
}

absl::StatusOr<StartedPlan> PlanManager::Start(const char* op, const std::string& tensor,
                                               const std::string& target_tensor,
                                               const TargetFn& target_fn, DoneCallback done) {
  absl::StatusOr<StartedMember> started =
      StartMember(op, tensor, target_tensor, target_fn, std::move(done), MemberInput{});
  if (!started.ok()) return started.status();
  StartedPlan out = std::move(started->plan);
  const std::string& id = out.id;
  MemoryDemand demand;
  {
    absl::MutexLock lock(&mu_);
    demand = plans_.at(id).demand;
  }
  if (absl::Status s = AdmitAndSend(absl::StrCat("plan ", id), id, std::move(demand)); !s.ok()) {
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

absl::Status PlanManager::AdmitAndSend(const std::string& what, const std::string& txn,
                                       MemoryDemand demand) {
  if (options_.admission == nullptr) {
    Send(txn, 0);
    return absl::OkStatus();
  }
  std::vector<std::string> ids;
  {
    absl::MutexLock lock(&mu_);
    ids = transactions_.at(txn).members;
  }
  auto admitted = [this, ids, txn](int64_t bucket) {
    WatchCalls calls;
    {
      absl::MutexLock lock(&mu_);
      for (const std::string& id : ids) {
        auto it = plans_.find(id);
        if (it == plans_.end() || it->second.ended()) continue;
        it->second.bucket_bytes = bucket;
        it->second.waiting_for_memory.clear();
        for (auto& call : ChangedLocked(it->second)) calls.push_back(std::move(call));
      }
    }
    Tell(calls);
    Send(txn, bucket);
  };
  auto refuse = [this, txn](const absl::Status& s) {
    AbortTransaction(txn, std::string(s.message()), s.code());
  };
  absl::StatusOr<AdmissionController::Grant> grant =
      options_.admission->Request(what, std::move(demand), /*may_wait=*/true, admitted, refuse);
  if (!grant.ok()) return grant.status();
  // The ticket is the transaction's until it is over; if it is over already (a refusal, or
  // an admitted plan that ran to its end meanwhile), it goes now.
  bool release = false;
  WatchCalls calls;
  {
    absl::MutexLock lock(&mu_);
    auto t = transactions_.find(txn);
    if (t != transactions_.end() && !t->second.over) {
      t->second.admission_ticket = grant->ticket;
    } else {
      release = true;
    }
    if (!grant->admitted) {
      for (const std::string& id : ids) {
        auto it = plans_.find(id);
        if (it == plans_.end() || it->second.ended() || it->second.bucket_bytes > 0) {
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

void PlanManager::Discard(const std::string& id) {
  std::string tensor, target_tensor, target_mesh;
  Timer::Id timer = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end()) return;
    const PlanRecord& e = it->second;
    tensor = e.tensor;
    target_tensor = e.target_tensor;
    target_mesh = e.target_mesh;
    if (!e.shared()) {
      auto t = transactions_.find(id);
      if (t != transactions_.end()) timer = t->second.timer;
      transactions_.erase(id);
    }
    plans_.erase(it);
  }
  if (timer != 0) timer_->Cancel(timer);
  ReleaseTensors(tensor, target_tensor, id, target_mesh);
}

// ---- Progress and watchers ---------------------------------------------------------------

PlanProgress PlanManager::ProgressLocked(const PlanRecord& e) const {
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

PlanManager::WatchCalls PlanManager::ChangedLocked(PlanRecord& e) {
  ++e.seq;
  WatchCalls calls;
  if (e.watchers.empty()) return calls;
  const PlanProgress p = ProgressLocked(e);
  for (const auto& [wid, fn] : e.watchers) calls.emplace_back(fn, p);
  return calls;
}

void PlanManager::Tell(const WatchCalls& calls) {
  for (const auto& [fn, p] : calls) {
    // A final update is delivered by Complete, after the done callbacks.
    if (!p.ended()) fn(p);
  }
}

std::string PlanManager::Namespaced(absl::string_view prefix, int64_t n) const {
  if (options_.id_namespace.empty()) return absl::StrCat(prefix, n);
  return absl::StrCat(prefix, options_.id_namespace, ".", n);
}

std::string PlanManager::CommPrefixLocked() const {
  return absl::StrCat(Namespaced("shardcoord/comm/", comm_epoch_), "/");
}

void PlanManager::RetireLocked(const std::string& id) {
  ended_.push_back(id);
  while (ended_.size() > options_.keep_ended_plans) {
    // A single plan's transaction goes with it; a group's is kept on its own (OnMemberDone).
    auto it = plans_.find(ended_.front());
    if (it != plans_.end() && !it->second.shared()) transactions_.erase(it->first);
    if (it != plans_.end()) plans_.erase(it);
    ended_.pop_front();
  }
}

namespace {

// A trace's plan part, from a plan's record or a fused group's transaction: `state`, and the
// id, error and times the record holds.
template <typename Record>
v1::PlanTrace TraceHeader(const Record& r, const std::string& tensor, const std::string& op,
                          PlanState state) {
  v1::PlanTrace out;
  out.set_plan_id(r.id);
  out.set_tensor(tensor);
  out.set_op(op);
  out.set_state(static_cast<v1::PlanState>(static_cast<int>(state)));
  out.set_error(r.error);
  out.set_start_unix_us(absl::ToUnixMicros(r.start));
  if (r.transferred != absl::InfinitePast()) {
    out.set_transferred_unix_us(absl::ToUnixMicros(r.transferred));
  }
  if (r.end != absl::InfiniteFuture()) out.set_end_unix_us(absl::ToUnixMicros(r.end));
  return out;
}

void AddRankTrace(int64_t rank, const v1::RankTrace& timing, const std::string& worker,
                  v1::PlanTrace& out) {
  v1::RankTrace* r = out.add_ranks();
  *r = timing;
  r->set_rank(rank);
  r->set_worker(worker);
}

}  // namespace

absl::StatusOr<v1::PlanTrace> PlanManager::Trace(const std::string& plan_id) const {
  absl::MutexLock lock(&mu_);
  if (auto tt = transactions_.find(plan_id); tt != transactions_.end() && tt->second.fused()) {
    // The fused plan: the group's phases and each worker's exchange rounds.
    const Transaction& t = tt->second;
    v1::PlanTrace out = TraceHeader(
        t, absl::StrCat(t.members.size(), t.members.size() == 1 ? " tensor" : " tensors"), "group",
        t.state);
    for (const auto& [rank, p] : t.participants) AddRankTrace(rank, p.timing, p.endpoint.name, out);
    return out;
  }
  auto it = plans_.find(plan_id);
  if (it == plans_.end()) return absl::NotFoundError(absl::StrCat("unknown plan '", plan_id, "'"));
  const PlanRecord& e = it->second;
  const PlanProgress progress = ProgressLocked(e);
  // Its ranks' tracks are its transaction's (a group member ran inside the fused plan), while
  // that is kept.
  const Transaction* txn = nullptr;
  if (auto t = transactions_.find(e.txn); t != transactions_.end()) txn = &t->second;
  v1::PlanTrace out = TraceHeader(e, e.target_tensor, e.op, progress.state);
  for (const auto& [rank, p] : e.participants) {
    const v1::RankTrace* timing = &p.timing;
    if (txn != nullptr) {
      auto tp = txn->participants.find(rank);
      if (tp != txn->participants.end()) timing = &tp->second.timing;
    }
    AddRankTrace(rank, *timing, p.endpoint.name, out);
  }
  return out;
}

std::vector<v1::PlanSummary> PlanManager::List(size_t limit) const {
  absl::MutexLock lock(&mu_);
  std::vector<const PlanRecord*> records;
  records.reserve(plans_.size());
  for (const auto& [id, e] : plans_) records.push_back(&e);
  // Ids do not sort by age ("p-9" > "p-10"); start times do, ties broken by id.
  std::sort(records.begin(), records.end(), [](const PlanRecord* a, const PlanRecord* b) {
    return a->start != b->start ? a->start > b->start : a->id > b->id;
  });
  if (records.size() > limit) records.resize(limit);
  std::vector<v1::PlanSummary> out;
  out.reserve(records.size());
  for (const PlanRecord* e : records) {
    const PlanProgress progress = ProgressLocked(*e);
    v1::PlanSummary& p = out.emplace_back();
    p.set_plan_id(e->id);
    p.set_tensor(e->target_tensor);
    p.set_source_tensor(e->tensor);
    p.set_op(e->op);
    p.set_group(e->shared() ? e->txn : "");
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
    PlanRecord& e = it->second;
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