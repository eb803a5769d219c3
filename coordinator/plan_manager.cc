#include "coordinator/plan_manager.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace shardcoord {
namespace {

std::string Describe(const WorkerEndpoint& w) {
  return absl::StrCat("worker ", w.name, " (rank ", w.rank, ")");
}

std::string ChunksString(const std::vector<Chunk>& chunks) {
  std::vector<std::string> parts;
  for (const Chunk& c : chunks) {
    parts.push_back(absl::StrCat(c.box.ToString(), "@", c.local_offset,
                                 c.partial_index ? absl::StrCat("p", c.partial_index) : ""));
  }
  return absl::StrCat("{", absl::StrJoin(parts, " "), "}");
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
      timer_->Cancel(e.timer);
      if (e.grace_timer != 0) timer_->Cancel(e.grace_timer);
    }
  }
}

LivenessFn PlanManager::Liveness() const {
  return [workers = workers_](int64_t rank, int64_t incarnation) {
    return workers->IsLive(rank, incarnation);
  };
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
                                                                  const Layout& target) {
  PlanOptions options;
  options.hosts_by_rank = workers_->HostsByRank();
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
  absl::StatusOr<std::shared_ptr<const Plan>> plan = MakePlan(*rec, *source, target->layout);
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

absl::StatusOr<StartedPlan> PlanManager::Gather(const std::string& tensor, const std::string& mesh,
                                                std::optional<int64_t> to_rank, DoneCallback done) {
  return Start(
      "gather", tensor, tensor,
      [&](const TensorRecord& rec) -> absl::StatusOr<Target> {
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
            return absl::InvalidArgumentError(absl::StrCat(
                "mesh: tensor '", rec.name, "' is on no mesh; name the mesh to gather to"));
          }
          return m.status();
        }
        Spec spec;
        spec.mesh = m->name;
        spec.placements.assign(m->mesh.ndim(), Placement::Replicate());
        return ResolveSpec(rec, spec);
      },
      std::move(done));
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
                                               const TargetFn& target_fn, DoneCallback done) {
  const bool copy = target_tensor != tensor;
  absl::StatusOr<TensorRecord> current = tensors_->Get(tensor);
  if (!current.ok()) return current.status();
  absl::StatusOr<TensorRecord> current_dst = current;
  if (copy) {
    current_dst = tensors_->Get(target_tensor);
    if (!current_dst.ok()) return current_dst.status();
    if (absl::Status s = CheckCopyable(*current, *current_dst); !s.ok()) return s;
  }
  absl::StatusOr<Target> target = target_fn(*current_dst);
  if (!target.ok()) return target.status();
  for (const RankChunks& rc : target->layout.ranks()) {
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(rc.rank);
    if (!w.ok()) return w.status();
    if (!w->alive) {
      return absl::FailedPreconditionError(
          absl::StrCat(w->Describe(), " in the target layout is dead (", w->death_reason, ")"));
    }
  }

  std::string id, prefix;
  {
    absl::MutexLock lock(&mu_);
    if (!closed_.empty()) return absl::UnavailableError(closed_);
    id = options_.id_namespace.empty()
             ? absl::StrCat("p-", next_plan_++)
             : absl::StrCat("p-", options_.id_namespace, ".", next_plan_++);
    prefix = CommPrefixLocked();
  }
  // The target tensor counts as a user of the target mesh; a Copy's source only reads.
  absl::StatusOr<TensorRecord> rec = tensors_->Acquire(tensor, id, copy ? "" : target->mesh);
  if (!rec.ok()) return rec.status();
  absl::StatusOr<TensorRecord> dst_rec = rec;
  if (copy) {
    dst_rec = tensors_->Acquire(target_tensor, id, target->mesh);
    if (!dst_rec.ok()) {
      tensors_->Release(tensor, id);
      return dst_rec.status();
    }
  }
  auto fail = [&](absl::Status s) {
    ReleaseTensors(tensor, target_tensor, id, target->mesh);
    return s;
  };
  if (rec->shape != target->layout.global_shape()) {
    return fail(absl::AbortedError(absl::StrCat("tensor '", tensor, "' changed shape")));
  }
  if (copy) {
    // The target was dst's layout when looked up; a plan that committed since moved it.
    if (dst_rec->version != current_dst->version) {
      return fail(absl::AbortedError(
          absl::StrCat("tensor '", target_tensor, "' changed while the copy was planned")));
    }
    if (absl::Status s = CheckCopyable(*rec, *dst_rec); !s.ok()) return fail(s);
  }
  absl::StatusOr<Layout> source = LiveLayout(*rec, Liveness());
  if (!source.ok()) return fail(source.status());
  absl::StatusOr<std::shared_ptr<const Plan>> plan = MakePlan(*rec, *source, target->layout);
  if (!plan.ok()) return fail(plan.status());

  Entry e;
  e.id = id;
  e.op = op;
  e.tensor = tensor;
  e.target_tensor = target_tensor;
  e.plan = *plan;
  e.target_mesh = target->mesh;
  e.target_spec = target->spec;
  e.source_version = rec->version;
  e.target_version = tensors_->NewVersion();
  e.old_target_version = dst_rec->version;
  e.communicator_prefix = prefix;
  FragmentOptions fo;
  fo.plan_id = id;
  fo.tensor = tensor;
  fo.target_tensor = target_tensor;
  fo.source_version = e.source_version;
  fo.target_version = e.target_version;
  fo.step_timeout_ms = absl::ToInt64Milliseconds(options_.step_timeout);
  fo.communicator_prefix = e.communicator_prefix;
  for (int64_t r : PlanParticipants(**plan)) {
    absl::StatusOr<WorkerRecord> w = workers_->GetByRank(r);
    if (!w.ok()) return fail(w.status());
    if (!w->alive) {
      return fail(absl::FailedPreconditionError(absl::StrCat(
          w->Describe(), " takes part in the plan but is dead (", w->death_reason, ")")));
    }
    Participant& p = e.participants[r];
    p.endpoint = WorkerEndpoint{w->spec.name, w->rank, w->spec.address, w->incarnation};
    fo.incarnations[r] = w->incarnation;
  }
  for (const RankTraffic& t : (*plan)->traffic) {
    auto it = e.participants.find(t.rank);
    if (it != e.participants.end()) it->second.bytes_expected = t.bytes_received;
  }
  std::vector<std::pair<WorkerEndpoint, v1::PlanFragment>> fragments;
  for (const auto& [r, p] : e.participants) {
    fragments.emplace_back(p.endpoint, MakeFragment(**plan, r, fo));
  }

  const absl::Time now = clock_->Now();
  e.start = now;
  if (done) e.done.push_back(std::move(done));
  e.timer = timer_->Schedule(now + options_.plan_timeout, [this, id] {
    std::string reason;
    {
      absl::MutexLock lock(&mu_);
      auto it = plans_.find(id);
      if (it == plans_.end()) return;
      const Entry& pe = it->second;
      std::vector<std::string> waiting;
      for (const auto& [r, p] : pe.participants) {
        if (!p.executed) {
          waiting.push_back(absl::StrCat(Describe(p.endpoint), " (no answer to Execute)"));
        } else if (!p.reported) {
          waiting.push_back(absl::StrCat(Describe(p.endpoint), " (no final report)"));
        }
      }
      reason = absl::StrCat("timed out after ", absl::FormatDuration(options_.plan_timeout),
                            " in state ", PlanStateName(pe.state), "; waiting for ",
                            waiting.empty() ? "validation" : absl::StrJoin(waiting, ", "));
    }
    Abort(id, reason);
  });

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
  for (auto& [endpoint, fragment] : fragments) {
    const int64_t rank = endpoint.rank;
    client_->Execute(endpoint, fragment,
                     [this, id, rank](absl::Status s) { OnExecuteDone(id, rank, s); });
  }
  return out;
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
    auto pit = e.participants.find(report.rank);
    if (pit == e.participants.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("rank ", report.rank, " takes no part in plan ", e.id));
    }
    Participant& p = pit->second;
    if (p.endpoint.name != report.worker || p.endpoint.incarnation != report.incarnation) {
      return absl::AbortedError(
          absl::StrCat("report for rank ", report.rank, " from worker ", report.worker,
                       " incarnation ", report.incarnation, " is stale: plan ", e.id, " runs with ",
                       Describe(p.endpoint), " incarnation ", p.endpoint.incarnation));
    }
    if (!report.error.empty()) {
      const std::string reason = absl::StrCat(Describe(p.endpoint), " failed: ", report.error);
      if (options_.failure_grace <= absl::ZeroDuration()) {
        abort_reason = reason;
      } else if (e.failing.empty()) {
        e.failing = reason;
        start_grace = true;
      }
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
        validate = true;
      }
      calls = ChangedLocked(e);
    }
  }
  if (!abort_reason.empty()) {
    Abort(report.plan_id, abort_reason);
    return absl::OkStatus();
  }
  if (start_grace) {
    const std::string id = report.plan_id;
    const Timer::Id t = timer_->Schedule(clock_->Now() + options_.failure_grace, [this, id] {
      std::string reason;
      {
        absl::MutexLock lock(&mu_);
        auto it = plans_.find(id);
        if (it == plans_.end()) return;
        reason = it->second.failing;
      }
      Abort(id, reason);
    });
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it != plans_.end()) it->second.grace_timer = t;
  }
  Tell(calls);
  if (validate) Validate(report.plan_id);
  return absl::OkStatus();
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
        aborts.emplace_back(id,
                            absl::StrCat(worker.Describe(), " ", reason,
                                         e.failing.empty() ? "" : "; before that, ", e.failing));
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

void PlanManager::Commit(const std::string& id, LayoutChecksums checksums) {
  TensorManager::NewState state;
  std::string tensor, target_tensor;
  std::vector<WorkerEndpoint> finish;
  int64_t old_target_version = 0;
  Timer::Id timer = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.state_ended() || it->second.closing) return;
    Entry& e = it->second;
    e.closing = true;  // From here on deaths and timeouts no longer abort it.
    tensor = e.tensor;
    target_tensor = e.target_tensor;
    state.mesh = e.target_mesh;
    state.spec = e.target_spec;
    state.layout = e.plan->target;
    state.checksums = std::move(checksums);
    state.version = e.target_version;
    for (const RankChunks& rc : e.plan->target.ranks()) {
      state.incarnations[rc.rank] = e.participants.at(rc.rank).endpoint.incarnation;
    }
    for (const auto& [r, p] : e.participants) finish.push_back(p.endpoint);
    old_target_version = e.old_target_version;
    timer = e.timer;
  }
  timer_->Cancel(timer);
  if (absl::Status s = tensors_->Commit(target_tensor, id, std::move(state)); !s.ok()) {
    {
      absl::MutexLock lock(&mu_);
      plans_.at(id).closing = false;
    }
    return Abort(id, absl::StrCat("commit failed: ", s.message()));
  }
  // A Copy's source was only read: it keeps its version and is free again.
  if (target_tensor != tensor) tensors_->Release(tensor, id);
  std::vector<std::pair<WatchFn, PlanProgress>> calls;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = plans_.at(id);
    e.state = PlanState::kCommitted;
    e.end = clock_->Now();
    calls = ChangedLocked(e);
  }
  Tell(calls);
  // Old buffers are dropped; the plan completes once every live participant has answered
  // (dead ones would only hold up the caller until the RPC deadline).
  std::vector<WorkerEndpoint> live;
  for (const WorkerEndpoint& w : finish) {
    if (workers_->IsLive(w.rank, w.incarnation)) live.push_back(w);
  }
  if (live.empty()) return Complete(id, absl::OkStatus());
  auto remaining = std::make_shared<std::atomic<int64_t>>(static_cast<int64_t>(live.size()));
  v1::FinishPlanRequest req;
  req.set_plan_id(id);
  req.set_tensor(target_tensor);
  req.set_commit(true);
  req.set_drop_version(old_target_version);
  for (const WorkerEndpoint& w : live) {
    client_->FinishPlan(w, req, [this, id, remaining](absl::Status) {
      if (remaining->fetch_sub(1) == 1) Complete(id, absl::OkStatus());
    });
  }
}

void PlanManager::Abort(const std::string& id, const std::string& reason) {
  std::vector<WorkerEndpoint> participants;
  std::string tensor, target_tensor, target_mesh;
  int64_t target_version = 0;
  Timer::Id timer = 0, grace_timer = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end() || it->second.state_ended() || it->second.closing) return;
    Entry& e = it->second;
    e.state = PlanState::kAborted;
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
  timer_->Cancel(timer);
  if (grace_timer != 0) timer_->Cancel(grace_timer);
  // The old layout was never replaced; the tensors are free again at once.
  ReleaseTensors(tensor, target_tensor, id, target_mesh);
  v1::FinishPlanRequest req;
  req.set_plan_id(id);
  req.set_tensor(target_tensor);
  req.set_commit(false);
  req.set_drop_version(target_version);
  for (const WorkerEndpoint& w : participants) {
    client_->FinishPlan(w, req, [](absl::Status) {});
  }
  Complete(id, absl::AbortedError(absl::StrCat(
                   "plan ", id, " on tensor '", target_tensor, "'",
                   target_tensor == tensor ? "" : absl::StrCat(" (copy of '", tensor, "')"),
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

void PlanManager::Complete(const std::string& id, const absl::Status& status) {
  std::vector<DoneCallback> done;
  std::vector<WatchFn> watchers;
  PlanProgress progress;
  std::string prefix;
  const char* op = "";
  std::shared_ptr<const Plan> plan;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(id);
    if (it == plans_.end()) return;
    Entry& e = it->second;
    ++e.seq;
    progress = ProgressLocked(e);
    op = e.op;
    plan = e.plan;
    done.swap(e.done);
    for (auto& [wid, fn] : e.watchers) watchers.push_back(std::move(fn));
    e.watchers.clear();
    // Only an abort retires the epoch's rendezvous keys (Abort moved the epoch on); a
    // committed plan leaves its communicators to the next plans over the same groups.
    if (!status.ok()) prefix = e.communicator_prefix;
    e.completed = true;
    RetireLocked(id);
  }
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
  if (options_.on_plan_end) options_.on_plan_end(progress, prefix);
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
