#include "worker/control/worker_core.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "proto/convert.h"
#include "sharding/fill.h"
#include "sharding/layout.h"
#include "worker/buffers/buffer_staging.h"
#include "worker/control/transfer_runner.h"
#include "worker/plans/fragment.h"
#include "worker/plans/fused_exchange.h"

namespace shardcoord {
namespace {

constexpr size_t kRememberEndedPlans = 4096;
constexpr int kFinalReportAttempts = 3;

std::string StatusText(const absl::Status& s) {
  return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
}

// The log line of a fragment that starts.
std::string DescribeStart(const Fragment& f) {
  if (f.fused) {
    int64_t transfers = 0;
    for (size_t i = 0; i < f.members.size(); ++i) {
      transfers += static_cast<int64_t>(f.shape_of(i).transfers.size());
    }
    return absl::StrCat("plan ", f.plan_id, ": rank ", f.rank, " executes a fused group of ",
                        f.members.size(), " members (", f.shapes.size(), " shapes), ", transfers,
                        " transfers over ", f.exchange_ranks.size(), " exchange ranks");
  }
  const FragmentMember& m = f.members[0];
  return absl::StrCat("plan ", f.plan_id, ": rank ", f.rank, " executes ", f.shapes[0].steps.size(),
                      " steps of tensor '", m.tensor, "' v", m.source_version, " -> ",
                      m.target_tensor == m.tensor ? "" : absl::StrCat("'", m.target_tensor, "' "),
                      "v", m.target_version);
}

// How many rounds report progress (all but the last: the final report follows it at once):
// a plan's steps, or a fused exchange's rounds.
size_t ProgressSteps(const Fragment& f) {
  if (!f.fused) return f.shapes[0].steps.size();
  return f.exchange_ranks.size() > 1 ? f.exchange_ranks.size() - 1 : 0;
}

// What a strategy produced: the checksums of each member, bytes, the timings, a summary for
// the log, and a single plan's target chunks (a fused fragment's are its shapes').
struct RunOutcome {
  RankChunks plan_chunks;
  std::vector<std::vector<uint64_t>> checksums;
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
  std::vector<v1::StepTiming> steps;
  std::string summary;
};

// A plan: its steps in order (worker/plans/executor.h).
absl::StatusOr<RunOutcome> RunSteps(const Fragment& f, const GroupMemberBuffers& buffers,
                                    CommunicatorCache* communicators, CancelToken* cancel,
                                    const ExecutorOptions& options, ProgressCallback progress) {
  ExecuteInput in;
  in.fragment = &f;
  in.source = buffers.source;
  in.target = buffers.target;
  in.communicators = communicators;
  in.cancel = cancel;
  in.options = options;
  in.progress = std::move(progress);
  absl::StatusOr<ExecuteResult> r = ExecuteFragment(in);
  if (!r.ok()) return r.status();
  RunOutcome out;
  out.plan_chunks = std::move(r->chunks);
  out.checksums.push_back(std::move(r->checksums));
  out.bytes_sent = r->bytes_sent;
  out.bytes_received = r->bytes_received;
  for (const StepReport& s : r->steps) {
    v1::StepTiming& t = out.steps.emplace_back();
    t.set_index(s.index);
    t.set_op(StepOpName(s.method));
    t.set_start_unix_us(absl::ToUnixMicros(s.start));
    t.set_duration_us(absl::ToInt64Microseconds(s.time));
    t.set_bytes_sent(s.bytes_sent);
    t.set_bytes_received(s.bytes_received);
    absl::StrAppend(&out.summary, " [step ", s.index, " ", StepOpName(s.method), " sent ",
                    s.bytes_sent, " B recv ", s.bytes_received, " B in ",
                    absl::FormatDuration(s.time), "]");
  }
  return out;
}

// A fused transaction: one exchange of every member's transfers (worker/plans/
// fused_exchange.h).
absl::StatusOr<RunOutcome> RunFusedExchange(const Fragment& f,
                                            std::vector<GroupMemberBuffers> buffers,
                                            CommunicatorCache* communicators, CancelToken* cancel,
                                            const ExecutorOptions& options,
                                            ProgressCallback progress,
                                            GroupScheduleCache* schedule_cache) {
  GroupExecuteInput in;
  in.schedule_cache = schedule_cache;
  in.fragment = &f;
  in.buffers = std::move(buffers);
  in.communicators = communicators;
  in.cancel = cancel;
  in.options = options;
  in.progress = std::move(progress);
  absl::StatusOr<GroupExecuteResult> r = ExecuteGroup(in);
  if (!r.ok()) return r.status();
  RunOutcome out;
  out.checksums.reserve(r->members.size());
  for (GroupMemberResult& m : r->members) out.checksums.push_back(std::move(m.checksums));
  out.bytes_sent = r->bytes_sent;
  out.bytes_received = r->bytes_received;
  for (const ExchangeRound& round : r->rounds) {
    v1::StepTiming& t = out.steps.emplace_back();
    t.set_index(round.round);
    t.set_op("fused_exchange");
    t.set_start_unix_us(absl::ToUnixMicros(round.start));
    t.set_duration_us(absl::ToInt64Microseconds(round.time));
    t.set_bytes_sent(round.bytes_sent);
    t.set_bytes_received(round.bytes_received);
    t.set_send_peer(round.send_peer);
    t.set_recv_peer(round.recv_peer);
    t.set_buckets_sent(round.buckets_sent);
    t.set_buckets_received(round.buckets_received);
    absl::StrAppend(&out.summary, " [round ", round.round, " to ", round.send_peer, " ",
                    round.bytes_sent, " B in ", round.buckets_sent, " buckets, from ",
                    round.recv_peer, " ", round.bytes_received, " B in ", round.buckets_received,
                    " buckets, ", round.windows, " windows, ", absl::FormatDuration(round.time),
                    "]");
  }
  absl::StrAppend(&out.summary, " staging ", r->staging_bytes, " B (bucket ", r->bucket_bytes,
                  " B)");
  return out;
}

// The one strategy choice: `buffers` holds each member's, index for index.
absl::StatusOr<RunOutcome> RunStrategy(const Fragment& f, std::vector<GroupMemberBuffers> buffers,
                                       CommunicatorCache* communicators, CancelToken* cancel,
                                       const ExecutorOptions& options, ProgressCallback progress,
                                       GroupScheduleCache* schedule_cache) {
  if (f.fused) {
    return RunFusedExchange(f, std::move(buffers), communicators, cancel, options,
                            std::move(progress), schedule_cache);
  }
  return RunSteps(f, buffers.at(0), communicators, cancel, options, std::move(progress));
}

void RememberEnded(const std::string& plan_id, absl::flat_hash_set<std::string>* ended,
                   std::deque<std::string>* order) {
  if (plan_id.empty() || !ended->insert(plan_id).second) return;
  order->push_back(plan_id);
  if (order->size() > kRememberEndedPlans) {
    ended->erase(order->front());
    order->pop_front();
  }
}

}  // namespace

// One member's buffers (a plain fragment has one part).
struct WorkerCore::RunPart {
  std::shared_ptr<HostBuffer> source;
  std::shared_ptr<HostBuffer> target;
  // A Copy into lent memory the executor cannot write in place (a process's plain memory):
  // `target` is the worker's, and its bytes are copied here before the report.
  std::shared_ptr<HostBuffer> write_back;
  bool stored = false;  // The target buffer is in the store (guarded by WorkerCore::mu_).
};

struct WorkerCore::PlanRun {
  // Shared, not copied: a prepared transfer's resident fragment serves every run.
  std::shared_ptr<const Fragment> fragment;
  RunHooks hooks;  // No on_end: a plan, reported with ReportChunks.
  // Execute prepares the buffers before it answers; StartRun on the run's thread.
  bool prepared = false;
  std::vector<RunPart> parts;  // One per fragment member, sized before the run is registered.
  CancelToken cancel;
  // Guarded by WorkerCore::mu_.
  bool aborted = false;  // FinishPlan(abort) or AbortAll arrived.

  const Fragment& f() const { return *fragment; }
  const std::string& plan_id() const { return fragment->plan_id; }
  int64_t rank() const { return fragment->rank; }
  const std::string& prefix() const { return fragment->communicator_prefix; }
  const FragmentMember& member(size_t i) const { return fragment->members[i]; }
};

WorkerCore::WorkerCore(BufferStore* buffers, CommunicatorCache* communicators,
                       ChunkReporter* reporter, std::function<WorkerIdentity()> identity,
                       ExecutorOptions options, std::function<void(absl::string_view)> log,
                       MemorySpace* space)
    : buffers_(buffers),
      communicators_(communicators),
      reporter_(reporter),
      identity_(std::move(identity)),
      options_(options),
      log_(std::move(log)),
      space_(space != nullptr ? space : &HostMemorySpace::Global()),
      transfers_(std::make_unique<TransferRunner>(this, buffers, identity_, log_)) {}

WorkerCore::~WorkerCore() { Shutdown(absl::InfiniteDuration()); }

absl::Status WorkerCore::CheckAcceptingLocked() const {
  if (shutting_down_) return absl::UnavailableError("worker is shutting down");
  if (!refusing_.empty()) return absl::UnavailableError(refusing_);
  return absl::OkStatus();
}

absl::Status WorkerCore::CheckAccepting() const {
  absl::MutexLock lock(&mu_);
  return CheckAcceptingLocked();
}

absl::Status WorkerCore::CheckPlanIdLocked(const std::string& plan_id) const {
  if (absl::Status s = CheckAcceptingLocked(); !s.ok()) return s;
  if (ended_.contains(plan_id)) {
    return absl::AbortedError(absl::StrCat("plan ", plan_id, " already finished"));
  }
  if (plans_.contains(plan_id)) {
    return absl::AlreadyExistsError(absl::StrCat("plan ", plan_id, " is already running"));
  }
  return absl::OkStatus();
}

absl::Status WorkerCore::PrepareBuffers(const FragmentShape& shape, const FragmentMember& member,
                                        RunPart* part) {
  // The names and versions are the member's; chunks and dtype the shape's.
  struct {
    const std::string& tensor;
    const std::string& target_tensor;
    int64_t source_version, attached_target_version;
    const std::string& plan_id;
    int64_t rank;
    DType dtype;
    DType target_dtype;  // The shape's cast's, or dtype.
    const RankChunks& source;
    const RankChunks& target;
  } f{member.tensor,  member.target_tensor, member.source_version, member.attached_target_version,
      member.plan_id, shape.rank,           shape.dtype,           shape.target_dtype(),
      shape.source,   shape.target};
  if (!f.source.chunks.empty()) {
    absl::StatusOr<std::shared_ptr<HostBuffer>> source = buffers_->Get(f.tensor, f.source_version);
    if (!source.ok()) return absl::FailedPreconditionError(source.status().message());
    if ((*source)->dtype() != f.dtype || (*source)->chunks().chunks != f.source.chunks) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor '", f.tensor, "' version ", f.source_version, " on rank ", f.rank,
          " is held as other chunks or another dtype than plan ", f.plan_id, " expects"));
    }
    // Lent memory the executor cannot read in place is copied in (one copy).
    absl::StatusOr<std::shared_ptr<HostBuffer>> local = BufferIn(*source, space_);
    if (!local.ok()) {
      return absl::Status(
          local.status().code(),
          absl::StrCat("reading tensor '", f.tensor, "' version ", f.source_version, " from ",
                       (*source)->space().name(), ": ", local.status().message()));
    }
    part->source = *std::move(local);
  }
  if (f.attached_target_version > 0) {
    // A Copy into an attached tensor writes the lent buffer in place.
    absl::StatusOr<std::shared_ptr<HostBuffer>> lent =
        buffers_->Get(f.target_tensor, f.attached_target_version);
    if (!lent.ok() || !(*lent)->attached() || (*lent)->dtype() != f.target_dtype ||
        (*lent)->chunks().chunks != f.target.chunks) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", f.rank, " holds no attached buffer of tensor '", f.target_tensor,
                       "' version ", f.attached_target_version, " with the chunks plan ", f.plan_id,
                       " writes (was it detached?)"));
    }
    if (&(*lent)->space() == space_) {
      part->target = *lent;
    } else {
      part->write_back = *lent;
    }
  }
  return absl::OkStatus();
}

absl::Status WorkerCore::PrepareParts(PlanRun* run) {
  const Fragment& f = run->f();
  // The targets to make (those not written in place), all in one allocation: their chunk
  // descriptions are the fragment's own, shared.
  std::vector<HostBuffer::Spec> specs;
  std::vector<size_t> spec_parts;
  for (size_t i = 0; i < f.members.size(); ++i) {
    if (absl::Status s = PrepareBuffers(f.shape_of(i), f.members[i], &run->parts[i]); !s.ok()) {
      if (!f.fused) return s;
      return absl::Status(s.code(), absl::StrCat("member ", f.members[i].index, " (plan ",
                                                 f.members[i].plan_id, "): ", s.message()));
    }
    if (run->parts[i].target != nullptr) continue;
    const FragmentShape& shape = f.shape_of(i);
    specs.push_back(
        {shape.target_dtype(), std::shared_ptr<const RankChunks>(run->fragment, &shape.target)});
    spec_parts.push_back(i);
  }
  absl::StatusOr<std::vector<std::shared_ptr<HostBuffer>>> targets =
      HostBuffer::CreateMany(specs, space_);
  if (!targets.ok()) return targets.status();
  for (size_t k = 0; k < spec_parts.size(); ++k) {
    run->parts[spec_parts[k]].target = std::move((*targets)[k]);
  }
  return absl::OkStatus();
}

absl::Status WorkerCore::Execute(const v1::PlanFragment& proto) {
  absl::StatusOr<Fragment> fragment = ParseFragment(proto);
  if (!fragment.ok()) return fragment.status();
  auto run = std::make_shared<PlanRun>();
  run->fragment = std::make_shared<const Fragment>(*std::move(fragment));
  run->parts.resize(run->f().members.size());
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckPlanIdLocked(run->plan_id()); !s.ok()) return s;
  }
  // Before answering: a missing source fails Execute itself.
  if (absl::Status s = PrepareParts(run.get()); !s.ok()) return s;
  run->prepared = true;
  return Launch(std::move(run));
}

absl::Status WorkerCore::StartRun(std::shared_ptr<const Fragment> fragment, RunHooks hooks) {
  auto run = std::make_shared<PlanRun>();
  run->fragment = std::move(fragment);
  run->hooks = std::move(hooks);
  // Sized before FinishPlan can see the run: its thread fills the parts in place while an
  // abort reads their `stored` flags.
  run->parts.resize(run->f().members.size());
  return Launch(std::move(run));
}

absl::Status WorkerCore::Launch(std::shared_ptr<PlanRun> run) {
  {
    absl::MutexLock lock(&mu_);
    // Again for Execute: it may have changed while the buffers were prepared.
    if (absl::Status s = CheckPlanIdLocked(run->plan_id()); !s.ok()) return s;
    plans_.emplace(run->plan_id(), run);
    ++running_;
  }
  // A hook's owner logs its own start line (it knows what the run is for).
  if (log_ && run->hooks.on_end == nullptr) log_(DescribeStart(run->f()));
  std::thread([this, run] { Run(run); }).detach();
  return absl::OkStatus();
}

void WorkerCore::Report(const PlanRun& run, v1::ReportChunksRequest request) {
  const WorkerIdentity id = identity_();
  request.set_plan_id(run.plan_id());
  request.set_worker(id.name);
  request.set_incarnation(id.incarnation);
  request.set_rank(run.rank());
  const int attempts = request.final() ? kFinalReportAttempts : 1;
  for (int i = 0; i < attempts; ++i) {
    absl::Status s = reporter_->ReportChunks(request);
    if (s.code() != absl::StatusCode::kUnavailable) return;  // Done, or not worth retrying.
  }
}

void WorkerCore::Run(std::shared_ptr<PlanRun> run) {
  const Fragment& f = run->f();
  const size_t steps = ProgressSteps(f);
  size_t steps_done = 0;
  ProgressCallback progress;
  if (run->hooks.on_end == nullptr) {
    progress = [&](int64_t done, int64_t /*total*/) {
      // The final report follows the last step at once.
      if (++steps_done >= steps) return;
      v1::ReportChunksRequest request;
      request.set_bytes_done(done);
      request.set_final(false);
      Report(*run, std::move(request));
    };
  }
  const absl::Time start = absl::Now();
  // The most the worker holds while this fragment runs, from its own accounting.
  const int64_t watermark = budget_ != nullptr ? budget_->OpenWatermark() : 0;
  absl::StatusOr<RunOutcome> result = absl::UnknownError("not run");
  absl::Status prepared = run->prepared ? absl::OkStatus() : PrepareParts(run.get());
  if (prepared.ok() && run->cancel.cancelled()) {
    prepared = absl::AbortedError(absl::StrCat("plan ", run->plan_id(), " was cancelled"));
  }
  if (prepared.ok()) {
    std::vector<GroupMemberBuffers> buffers;
    buffers.reserve(run->parts.size());
    for (const RunPart& p : run->parts) buffers.push_back({p.source.get(), p.target.get()});
    result = RunStrategy(f, std::move(buffers), communicators_, &run->cancel, options_, progress,
                         run->hooks.schedule_cache);
  } else {
    result = prepared;
  }
  // Copies into lent memory the executor could not write in place: one copy into the
  // process's memory each; a process that is gone fails the plan.
  for (size_t i = 0; i < run->parts.size() && result.ok(); ++i) {
    const RunPart& p = run->parts[i];
    if (p.write_back == nullptr) continue;
    const FragmentMember& m = run->member(i);
    absl::Status s =
        p.write_back->lent()->detached()
            ? absl::AbortedError(absl::StrCat("the target buffer (",
                                              p.write_back->lent()->Describe(), ") was detached"))
            : CopyBufferBytes(*p.target, *p.write_back);
    if (!s.ok()) {
      result = absl::Status(s.code(),
                            absl::StrCat("writing rank ", run->rank(), "'s attached buffer of '",
                                         m.target_tensor, "': ", s.message()));
    }
  }
  // Done with the source: its memory goes back before the report, so the commit that drops
  // the old version frees it (the coordinator's memory admission counts on that).
  for (RunPart& p : run->parts) p.source.reset();
  if (log_) {
    if (result.ok()) {
      log_(absl::StrCat("plan ", run->plan_id(), ": done in ",
                        absl::FormatDuration(absl::Now() - start), result->summary));
    } else {
      log_(absl::StrCat("plan ", run->plan_id(), ": failed: ", result.status().ToString()));
    }
  }

  bool aborted;
  {
    absl::MutexLock lock(&mu_);
    aborted = run->aborted;
    // Stored before the report, so a commit that follows finds them.
    for (size_t i = 0; i < run->parts.size() && result.ok() && !aborted; ++i) {
      RunPart& p = run->parts[i];
      const FragmentMember& m = run->member(i);
      std::shared_ptr<HostBuffer> keep = p.write_back ? p.write_back : p.target;
      if (keep->attached()) {
        // Lent memory follows the tensor's versions (also with no chunks on this rank),
        // unless it was detached meanwhile: then the plan fails.
        if (absl::Status s = buffers_->Store(m.target_tensor, m.target_version, keep); s.ok()) {
          p.stored = true;
        } else {
          result = s;
        }
      } else if (!f.shape_of(i).target.chunks.empty()) {
        buffers_->Put(m.target_tensor, m.target_version, p.target);
        p.stored = true;
      }
    }
    if (!result.ok()) {
      // A later part failed to store: the plan fails, so none of it stays.
      for (size_t i = 0; i < run->parts.size(); ++i) {
        if (!run->parts[i].stored) continue;
        buffers_->Drop(run->member(i).target_tensor, run->member(i).target_version);
        run->parts[i].stored = false;
      }
    }
  }
  // Stored (the store holds it) or not kept: a failed fragment's target, and the staging
  // copy of a lent target, are freed before the report, not when this thread ends.
  for (RunPart& p : run->parts) {
    p.target.reset();
    p.write_back.reset();
  }
  RunResult end;
  end.start = start;
  end.end = absl::Now();
  if (budget_ != nullptr) end.memory_peak_bytes = budget_->CloseWatermark(watermark);
  RankChunks plan_chunks;
  if (aborted) {
    end.status = absl::AbortedError(
        absl::StrCat("plan ", run->plan_id(), " was finished or abandoned before its part ended"));
  } else if (result.ok()) {
    end.checksums = std::move(result->checksums);
    end.bytes_sent = result->bytes_sent;
    end.bytes_received = result->bytes_received;
    end.steps = std::move(result->steps);
    plan_chunks = std::move(result->plan_chunks);
  } else {
    end.status = result.status();
  }
  // Where the outcome goes is the only difference between a plan and a hook's run.
  if (run->hooks.on_end) {
    run->hooks.on_end(std::move(end));
  } else if (!aborted) {
    ReportEnd(*run, end, plan_chunks);
  }
  absl::MutexLock lock(&mu_);
  --running_;
}

void WorkerCore::ReportEnd(const PlanRun& run, const RunResult& result,
                           const RankChunks& plan_chunks) {
  const Fragment& f = run.f();
  v1::ReportChunksRequest report;
  report.set_final(true);
  report.set_start_unix_us(absl::ToUnixMicros(result.start));
  report.set_end_unix_us(absl::ToUnixMicros(result.end));
  if (budget_ != nullptr) report.set_memory_peak_bytes(result.memory_peak_bytes);
  if (!result.status.ok()) {
    report.set_error(StatusText(result.status));
    Report(run, std::move(report));
    return;
  }
  for (const v1::StepTiming& t : result.steps) *report.add_steps() = t;
  report.set_bytes_done(result.bytes_received);
  if (f.fused) {
    // Every member holds its shape's target chunks (its buffer was made of them): the
    // chunks go once per shape, the checksums per member.
    for (const FragmentShape& shape : f.shapes) {
      v1::RankChunks* rc = report.add_shapes();
      *rc = RankChunksToProto(shape.target);
      rc->set_rank(f.rank);
    }
    for (size_t i = 0; i < f.members.size(); ++i) {
      v1::MemberChunks* m = report.add_members();
      m->set_index(f.members[i].index);
      m->set_shape(f.members[i].shape);
      m->mutable_checksums()->Add(result.checksums[i].begin(), result.checksums[i].end());
    }
  } else {
    *report.mutable_chunks() = RankChunksToProto(plan_chunks, result.checksums[0]);
    report.mutable_chunks()->set_rank(f.rank);
  }
  Report(run, std::move(report));
}

absl::Status WorkerCore::FinishPlan(const v1::FinishPlanRequest& request) {
  std::shared_ptr<PlanRun> run;
  {
    absl::MutexLock lock(&mu_);
    auto it = plans_.find(request.plan_id());
    if (it != plans_.end()) {
      run = it->second;
      plans_.erase(it);
    }
    RememberEnded(request.plan_id(), &ended_, &ended_order_);
    if (run != nullptr && !request.commit()) {
      run->aborted = true;
      for (size_t i = 0; i < run->parts.size(); ++i) {
        if (!run->parts[i].stored) continue;
        buffers_->Drop(run->member(i).target_tensor, run->member(i).target_version);
        run->parts[i].stored = false;
      }
    }
  }
  if (request.commit()) {
    // Never a version the plan just wrote. Views of the run's and the request's names (both
    // outlive this): a group's 1000 members cost no string copies.
    absl::flat_hash_set<std::pair<absl::string_view, int64_t>> written;
    // A prepared transfer's run names none: its hook drops the old versions.
    const bool drops = !request.tensor().empty() || request.members_size() > 0;
    if (run != nullptr && drops) written.reserve(run->parts.size());
    for (size_t i = 0; run != nullptr && drops && i < run->parts.size(); ++i) {
      written.emplace(run->member(i).target_tensor, run->member(i).target_version);
    }
    auto drop = [&](absl::string_view tensor, int64_t version) {
      if (version < 0 || tensor.empty() || written.contains({tensor, version})) return;
      buffers_->Drop(tensor, version);
    };
    drop(request.tensor(), request.drop_version());
    for (const v1::FinishMember& m : request.members()) drop(m.tensor(), m.drop_version());
  }
  // Outside the lock: it interrupts the fragment's waits.
  if (run != nullptr && !request.commit()) run->cancel.Cancel();
  if (log_ && run != nullptr) {
    log_(
        absl::StrCat("plan ", request.plan_id(), ": ", request.commit() ? "committed" : "aborted"));
  }
  // Communicators outlive a committed plan: the coordinator reuses the rendezvous prefix for
  // later plans over the same groups (one rendezvous per group, not per plan). An abort
  // retires the prefix everywhere, so drop them. The run (and its target buffers, unless
  // stored) goes when its thread is done with it.
  if (run != nullptr && !request.commit()) communicators_->ReleasePrefix(run->prefix());
  // Last: after it, the hook's owner may hand the fragment to its next run.
  if (run != nullptr && run->hooks.on_finish) run->hooks.on_finish(request.commit());
  return absl::OkStatus();
}

int WorkerCore::AbortAll() {
  std::vector<std::shared_ptr<PlanRun>> runs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, run] : plans_) {
      // A running fragment no longer stores its target nor reports. A stored target stays:
      // its plan may have committed at the coordinator just before it stopped, so the
      // registration reports it and the coordinator says whether to drop it.
      run->aborted = true;
      runs.push_back(run);
      RememberEnded(id, &ended_, &ended_order_);
    }
    plans_.clear();
  }
  for (const std::shared_ptr<PlanRun>& run : runs) {
    run->cancel.Cancel();
    communicators_->ReleasePrefix(run->prefix());
    if (log_) log_(absl::StrCat("plan ", run->plan_id(), ": abandoned"));
  }
  // The coordinator invalidated them: a worker registered again is prepared again.
  transfers_->ForgetAll();
  return static_cast<int>(runs.size());
}

absl::StatusOr<v1::FillResponse> WorkerCore::Fill(const v1::FillRequest& request) {
  if (request.tensor().empty()) return absl::InvalidArgumentError("tensor: empty");
  absl::StatusOr<DType> dtype = DTypeFromProto(request.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<Shape> shape = ShapeFromProto(request.global_shape(), "global_shape");
  if (!shape.ok()) return shape.status();
  absl::StatusOr<RankChunks> chunks = RankChunksFromProto(request.chunks(), "chunks");
  if (!chunks.ok()) return chunks.status();
  absl::StatusOr<ReduceOp> partial_op = ReduceOpFromProto(request.partial_op(), "partial_op");
  if (!partial_op.ok()) return partial_op.status();
  for (size_t i = 0; i < chunks->chunks.size(); ++i) {
    const Box& box = chunks->chunks[i].box;
    if (box.ndim() != static_cast<int>(shape->size()) || !box.InBounds(*shape)) {
      return absl::InvalidArgumentError(absl::StrCat("chunks.chunks[", i, "]: box ", box.ToString(),
                                                     " is outside shape ", ShapeToString(*shape)));
    }
  }
  FillKind kind;
  bool fill = true;
  switch (request.init()) {
    case v1::INIT_KIND_UNSPECIFIED:
    case v1::ZEROS:
      kind = FillKind::kZeros;
      break;
    case v1::ARANGE:
      kind = FillKind::kArange;
      break;
    case v1::RANDOM:
      kind = FillKind::kRandom;
      break;
    case v1::UNINITIALIZED:
      kind = FillKind::kZeros;
      fill = false;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("init: unknown value ", request.init()));
  }
  // Filled in host memory (the worker's own space when that is host memory, so it counts
  // against its budget); a device space gets it in one copy.
  absl::StatusOr<std::shared_ptr<HostBuffer>> buffer =
      HostBuffer::Create(*dtype, *chunks, space_->is_host() ? space_ : nullptr);
  if (!buffer.ok()) return buffer.status();
  HostBuffer& b = **buffer;
  std::memset(b.data(), 0, static_cast<size_t>(b.bytes()));  // Also clears the gaps.
  for (size_t i = 0; i < chunks->chunks.size(); ++i) {
    const Chunk& c = chunks->chunks[i];
    // Sum contributions: the value lives in contribution 0, the others are zero.
    const bool zeros = c.partial_index != 0 && (*partial_op == ReduceOp::kSum);
    if (!fill || zeros || kind == FillKind::kZeros) continue;
    absl::Status s = FillBox(kind, request.seed(), *shape, c.box, *dtype, b.chunk_data(i));
    if (!s.ok()) return s;
  }
  std::shared_ptr<HostBuffer> stored = *std::move(buffer);
  if (!space_->is_host()) {
    absl::StatusOr<std::shared_ptr<HostBuffer>> device =
        HostBuffer::Create(*dtype, *chunks, space_);
    if (!device.ok()) return device.status();
    absl::Status s = space_->CopyFromHost((*device)->data(), stored->data(), stored->bytes());
    if (!s.ok()) return s;
    stored = *std::move(device);
  }
  absl::StatusOr<std::vector<uint64_t>> checksums = stored->Checksums();
  if (!checksums.ok()) return checksums.status();
  buffers_->Put(request.tensor(), request.version(), stored);
  v1::FillResponse response;
  *response.mutable_chunks() = RankChunksToProto(stored->chunks(), *checksums);
  return response;
}

absl::StatusOr<v1::FillManyResponse> WorkerCore::FillMany(const v1::FillManyRequest& request) {
  v1::FillManyResponse response;
  response.mutable_chunks()->Reserve(request.fills_size());
  for (int i = 0; i < request.fills_size(); ++i) {
    absl::StatusOr<v1::FillResponse> r = Fill(request.fills(i));
    if (!r.ok()) {
      return absl::Status(r.status().code(),
                          absl::StrCat("fills[", i, "] ('", request.fills(i).tensor(),
                                       "'): ", r.status().message()));
    }
    *response.add_chunks() = std::move(*r->mutable_chunks());
  }
  return response;
}

absl::Status WorkerCore::DropTensor(const v1::DropTensorRequest& request) {
  if (!request.tensor().empty()) {
    if (request.version() == -1) {
      buffers_->DropTensor(request.tensor());
    } else {
      buffers_->Drop(request.tensor(), request.version());
    }
  }
  for (const std::string& tensor : request.tensors()) buffers_->DropTensor(tensor);
  return absl::OkStatus();
}

absl::StatusOr<WorkerCore::ChunkReader> WorkerCore::OpenRead(const v1::ReadChunkRequest& request) {
  absl::StatusOr<std::shared_ptr<HostBuffer>> buffer =
      buffers_->Get(request.tensor(), request.version());
  if (!buffer.ok()) return buffer.status();
  if (!(*buffer)->space().is_host() && &(*buffer)->space() != space_) {
    // Lent plain memory of a process: read through a copy (one process_vm_readv).
    buffer = BufferIn(*std::move(buffer), space_->is_host() ? space_ : &HostMemorySpace::Global());
    if (!buffer.ok()) return buffer.status();
  }
  absl::StatusOr<Box> box = BoxFromProto(request.box(), "box");
  if (!box.ok()) return box.status();
  const int k = FindContainingChunk((*buffer)->chunks(), *box, false, 0);
  if (k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("box: ", box->ToString(), " lies in no chunk of tensor '", request.tensor(),
                     "' version ", request.version(), " on this worker"));
  }
  ChunkReader reader;
  reader.buffer_ = *std::move(buffer);
  reader.chunk_ = k;
  reader.box_ = *std::move(box);
  reader.total_bytes_ = reader.box_.Volume() * reader.buffer_->element_size();
  return reader;
}

absl::Status WorkerCore::ChunkReader::Next(int64_t max_bytes, std::string* out) {
  const int64_t esize = buffer_->element_size();
  const int64_t volume = box_.Volume();
  const int64_t count = std::min(volume - next_, std::max<int64_t>(1, max_bytes / esize));
  if (count <= 0) return absl::OkStatus();
  MemorySpace& space = buffer_->space();
  const size_t start = out->size();
  out->resize(start + static_cast<size_t>(count * esize));
  // A device space packs the range into staging memory there, then copies it out.
  Allocation staging;
  absl::Cleanup free_staging = [&] { space.Free(staging); };
  char* p = out->data() + start;
  if (!space.is_host()) {
    absl::StatusOr<Allocation> a = space.Allocate(count * esize);
    if (!a.ok()) return a.status();
    staging = *a;
    p = staging.data;
  }
  const Chunk& chunk = buffer_->chunks().chunks[chunk_];
  for (const Box& rel : FlatRangeToBoxes(box_.shape(), next_, next_ + count)) {
    Shape offset = rel.offset();
    for (int d = 0; d < box_.ndim(); ++d) offset[d] += box_.offset(d);
    Box piece(offset, rel.shape());
    absl::Status s = space.PackBox(piece, buffer_->chunk_data(chunk_), chunk.box, p, esize);
    if (!s.ok()) return s;
    p += piece.Volume() * esize;
  }
  if (!space.is_host()) {
    absl::Status s = space.CopyToHost(out->data() + start, staging.data, count * esize);
    if (!s.ok()) return s;
  }
  next_ += count;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WorkerCore::ChunkWriter>> WorkerCore::OpenWrite(
    const v1::ChunkData& header) {
  if (header.tensor().empty()) return absl::InvalidArgumentError("tensor: empty");
  absl::StatusOr<DType> dtype = DTypeFromProto(header.dtype(), "dtype");
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<RankChunks> chunks = RankChunksFromProto(header.chunks(), "chunks");
  if (!chunks.ok()) return chunks.status();
  absl::StatusOr<std::shared_ptr<HostBuffer>> buffer = HostBuffer::Create(*dtype, *chunks, space_);
  if (!buffer.ok()) return buffer.status();
  if (header.total_bytes() != (*buffer)->bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "total_bytes: ", header.total_bytes(), " but a local buffer of ", chunks->local_elements,
        " ", DTypeName(*dtype), " elements holds ", (*buffer)->bytes(), " bytes"));
  }
  auto writer = std::make_unique<ChunkWriter>();
  writer->buffers_ = buffers_;
  writer->tensor_ = header.tensor();
  writer->version_ = header.version();
  writer->buffer_ = *std::move(buffer);
  if (absl::Status s = writer->Append(header.data()); !s.ok()) return s;
  return writer;
}

absl::Status WorkerCore::ChunkWriter::Append(absl::string_view data) {
  if (static_cast<int64_t>(data.size()) > buffer_->bytes() - written_) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: more than the announced total_bytes ", buffer_->bytes()));
  }
  if (buffer_->space().is_host()) {
    std::memcpy(buffer_->data() + written_, data.data(), data.size());
    flushed_ += static_cast<int64_t>(data.size());
  } else {
    pending_.append(data.data(), data.size());
  }
  written_ += static_cast<int64_t>(data.size());
  if (static_cast<int64_t>(pending_.size()) >= kStagingBytes) return Flush();
  return absl::OkStatus();
}

absl::Status WorkerCore::ChunkWriter::Flush() {
  if (pending_.empty()) return absl::OkStatus();
  absl::Status s = buffer_->space().CopyFromHost(buffer_->data() + flushed_, pending_.data(),
                                                 static_cast<int64_t>(pending_.size()));
  if (!s.ok()) return s;
  flushed_ += static_cast<int64_t>(pending_.size());
  pending_.clear();
  return absl::OkStatus();
}

absl::StatusOr<v1::WriteChunkResponse> WorkerCore::ChunkWriter::Finish() {
  if (written_ != buffer_->bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("data: received ", written_, " of ", buffer_->bytes(), " bytes"));
  }
  if (absl::Status s = Flush(); !s.ok()) return s;
  absl::StatusOr<std::vector<uint64_t>> checksums = buffer_->Checksums();
  if (!checksums.ok()) return checksums.status();
  v1::WriteChunkResponse response;
  *response.mutable_chunks() = RankChunksToProto(buffer_->chunks(), *checksums);
  buffers_->Put(tensor_, version_, buffer_);
  return response;
}

absl::StatusOr<v1::ReadBoxesResponse> WorkerCore::ReadBoxes(const v1::ReadBoxesRequest& request) {
  v1::ReadBoxesResponse out;
  int64_t total = 0;
  v1::ReadChunkRequest one;
  one.set_tensor(request.tensor());
  one.set_version(request.version());
  for (int i = 0; i < request.boxes_size(); ++i) {
    *one.mutable_box() = request.boxes(i);
    absl::StatusOr<ChunkReader> reader = OpenRead(one);
    if (!reader.ok()) {
      return absl::Status(reader.status().code(),
                          absl::StrCat("boxes[", i, "]: ", reader.status().message()));
    }
    total += reader->total_bytes();
    if (total > kMaxRelayBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "boxes: more than ", kMaxRelayBytes, " bytes in all (read large boxes with ReadChunk)"));
    }
    std::string* data = out.add_data();
    data->reserve(static_cast<size_t>(reader->total_bytes()));
    while (!reader->done()) {
      if (absl::Status s = reader->Next(kMaxRelayBytes, data); !s.ok()) return s;
    }
  }
  return out;
}

absl::StatusOr<v1::WriteChunkResponse> WorkerCore::WriteBuffer(const v1::ChunkData& message) {
  if (static_cast<int64_t>(message.data().size()) > kMaxRelayBytes) {
    return absl::InvalidArgumentError(absl::StrCat("data: ", message.data().size(),
                                                   " bytes, more than ", kMaxRelayBytes,
                                                   " (write large buffers with WriteChunk)"));
  }
  absl::StatusOr<std::unique_ptr<ChunkWriter>> writer = OpenWrite(message);  // Appends data.
  if (!writer.ok()) return writer.status();
  return (*writer)->Finish();
}

bool WorkerCore::Shutdown(absl::Duration grace) {
  std::vector<std::shared_ptr<PlanRun>> runs;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& [id, run] : plans_) runs.push_back(run);
  }
  for (auto& run : runs) run->cancel.Cancel();
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](int* running) { return *running == 0; }, &running_),
                              grace);
}

void WorkerCore::WaitIdle() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* running) { return *running == 0; }, &running_));
}

bool WorkerCore::StopAcceptingAndAwaitIdle(const std::string& reason, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  refusing_ = reason;
  return mu_.AwaitWithTimeout(absl::Condition(
                                  +[](int* running) { return *running == 0; }, &running_),
                              timeout);
}

int WorkerCore::running() const {
  absl::MutexLock lock(&mu_);
  return running_;
}

}  // namespace shardcoord
