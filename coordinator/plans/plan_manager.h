#ifndef SHARDCOORD_COORDINATOR_PLANS_PLAN_MANAGER_H_
#define SHARDCOORD_COORDINATOR_PLANS_PLAN_MANAGER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/timer.h"
#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/admission.h"
#include "coordinator/plans/coordinator_metrics.h"
#include "coordinator/plans/plan_relay.h"
#include "coordinator/state/tensor_manager.h"
#include "proto/convert.h"
#include "sharding/cost_model.h"
#include "sharding/plan.h"
#include "sharding/plan_fragment.h"
#include "sharding/plan_participants.h"
#include "sharding/planner.h"

namespace shardcoord {

// Values match shardcoord.v1.PlanState.
enum class PlanState : int {
  kPending = 1,      // Fragments are being handed to workers.
  kPrepared = 2,     // Every worker accepted its fragment (new buffers allocated).
  kTransferred = 3,  // Every worker reported its chunks; validating.
  kCommitted = 4,    // The new layout is authoritative.
  kAborted = 5,      // Rolled back: the old layout is authoritative.
};
std::string PlanStateName(PlanState state);  // "PENDING", ...

struct PlanProgress {
  std::string plan_id;
  std::string tensor;
  PlanState state = PlanState::kPending;
  int64_t bytes_done = 0;
  int64_t bytes_total = 0;
  std::string error;  // Why it was aborted.
  double seconds = 0;
  // Increases with every change: updates reach watchers from several threads, and a watcher
  // keeps the one with the highest seq.
  int64_t seq = 0;
  // Memory admission: the plan's bucket size once admitted; while it waits, why.
  int64_t bucket_bytes = 0;
  std::string waiting_for_memory;

  bool ended() const { return state == PlanState::kCommitted || state == PlanState::kAborted; }
};

struct PlanManagerOptions {
  // A plan that has not ended by then is aborted.
  absl::Duration plan_timeout = absl::Minutes(5);
  // Given to workers for each communication step.
  absl::Duration step_timeout = absl::Minutes(5);
  // A worker's error is often the echo of a peer's death (Gloo reports "connection closed
  // by peer" before the heartbeat timeout declares the peer dead). For this long after the
  // first worker error the plan stays doomed but not aborted, so that a participant death in
  // that window is what the abort names. Zero aborts at once. The daemon uses the heartbeat
  // timeout plus two heartbeat intervals.
  absl::Duration failure_grace = absl::ZeroDuration();
  size_t cache_capacity = 256;
  // Ended plans kept for Progress / WatchPlan.
  size_t keep_ended_plans = 1024;
  bool use_collectives = true;
  // Set by a coordinator with durable state to a number that is new on every start: plan
  // ids ("p-<ns>.<n>") and rendezvous prefixes then never repeat ones from before a
  // restart, which workers may still be running or holding. Empty: "p-<n>".
  std::string id_namespace;
  CostModel cost;
  // Called when a plan ends (before its callbacks) with its final progress and, for an
  // aborted plan, the rendezvous key prefix it retired (empty for a committed plan, whose
  // communicators stay in use); the daemon logs it and deletes those keys from the KvStore.
  // A group calls it once, when its last member ended, with plan_id the group's id, tensor
  // "N tensors" and bytes_total the members' sum; not for each member.
  std::function<void(const PlanProgress& final, const std::string& prefix)> on_plan_end;
  // Where ended plans are counted (plans by op and end state, duration, bytes); not owned,
  // may be null.
  CoordinatorMetrics* metrics = nullptr;
  // Memory admission (coordinator/plans/admission.h): a plan's (or a group's) fragments are sent
  // once its new buffers and staging fit every worker's budget, with the bucket size it
  // chose. Not owned; null: no admission, fragments go at once with the workers' default
  // buckets.
  AdmissionController* admission = nullptr;
  // A single plan whose tensor holds at most this many bytes, with no Partial layout and no
  // target written in place, is relayed: the coordinator reads the source chunks and writes
  // the new buffers itself (coordinator/plans/plan_relay.h) instead of sending fragments. 0: never
  // (every plan runs on the workers); the daemon's default is kDefaultRelayMaxBytes.
  int64_t relay_max_bytes = 0;
};

// A plan that was started (or, for a dry run, only planned).
struct StartedPlan {
  std::string id;      // Empty for a dry run.
  std::string tensor;  // The tensor that gets the new version (a Copy's dst).
  std::shared_ptr<const Plan> plan;
  PlanProgress progress;
  int64_t target_version = 0;  // The tensor's version once the plan commits.
};

// One member of a CopyGroup.
struct CopyMember {
  std::string src;
  std::string dst;
};

// One member of a RedistributeGroup.
struct RedistributeMember {
  std::string tensor;
  Spec target;  // target.mesh empty: the tensor's mesh.
};

// One member of a checkpoint load's exchange (coordinator/checkpoints/checkpoint_manager.h):
// `staging` is a tensor hidden by the load (TensorRecord::owner) holding what the readers read.
// With `into`, its values are copied into that existing tensor (as CopyGroup); otherwise it moves
// to `target` (on target.mesh) and becomes an ordinary tensor when the group commits, unless
// `keep_hidden`: then it stays hidden (owned by the load) at its target layout, for the load to
// publish with TensorManager::PublishAll once every group of the load committed.
struct LoadMember {
  std::string staging;
  std::string into;
  Spec target;
  bool keep_hidden = false;
  // Without `into`: the dtype the tensor is cast to as it moves to `target` (empty: the
  // checkpoint's). With `into`, the copy casts to the existing tensor's dtype.
  std::optional<DType> dtype;
  // Names the member in errors and labels (a block copy's "copies[2].dst"); empty:
  // "tensors[i]".
  std::string where;
};

// A group of plans that commit together (or none does).
struct GroupProgress {
  std::string group_id;
  PlanState state = PlanState::kPending;  // COMMITTED or ABORTED once every member ended.
  std::string error;                      // Why it was aborted, naming the member.
  double seconds = 0;
  std::vector<PlanProgress> members;  // In the group's order.
};

struct StartedGroup {
  std::string id;
  std::vector<StartedPlan> members;  // In the group's order; members[i].tensor is copies[i].dst.
  int64_t bytes_moved = 0;
  int64_t lower_bound_bytes = 0;
  // The fused exchange: messages over all pairs of ranks, cut with this bucket size.
  int64_t buckets = 0;
  int64_t bucket_bytes = 0;
};

// INVALID_ARGUMENT naming the member and field ("copies[2].dst: ...") for an empty group, an
// empty name, src == dst, or a tensor named twice in the group (as src or dst). Pure.
absl::Status CheckCopyGroup(const std::vector<CopyMember>& copies);
// As CheckCopyGroup for "redistributes[i].tensor": an empty group, an empty name, a tensor
// named twice.
absl::Status CheckRedistributeGroup(const std::vector<RedistributeMember>& members);
// As CheckCopyGroup for "tensors[i]" of a GatherGroup.
absl::Status CheckGatherGroup(const std::vector<std::string>& tensors);

// What a worker reports about its fragment (CoordinatorWorkers.ReportChunks).
struct WorkerReport {
  std::string plan_id;
  std::string worker;
  int64_t incarnation = 0;
  int64_t rank = 0;
  std::string error;       // Non-empty: the fragment failed.
  int64_t bytes_done = 0;  // Bytes this rank has received so far.
  bool final = false;      // Final reports carry chunks and checksums.
  RankChunks chunks;
  ChunkChecksums checksums;
  v1::RankTrace timing;  // Final reports: when the fragment and its steps ran.
  // A fused group's final report: the chunks of each shape of the rank's fragment, and each
  // member's shape and checksums (FragmentMember.index).
  struct Member {
    int32_t index = 0;
    int32_t shape = 0;
    ChunkChecksums checksums;
  };
  std::vector<Member> members;
  std::vector<RankChunks> shapes;
};

// Plans and their transactional lifecycle: PENDING -> PREPARED -> TRANSFERRED -> COMMITTED
// or ABORTED. A plan holds its tensor busy (a Copy holds both; a second plan on a busy
// tensor is ABORTED; plans on different tensors run at once), sends each participating worker its
// fragment, collects every worker's final report, validates them (each rank holds exactly its
// planned target chunks, the layout validates, replicas agree on checksums) and only then commits
// the new layout and tells workers to drop the old version. Any failure before that - a worker
// error, a failed validation, a participant that dies or re-registers, the plan timeout -
// aborts it everywhere: workers drop the new buffers and the old layout stays authoritative.
//
// Thread-safe. No lock is held while calling workers, other managers' listeners, or
// callbacks; completion callbacks may run on any thread, possibly before Redistribute
// returns.
class PlanManager : public WorkerListener {
 public:
  // (status, final progress): OK when committed, ABORTED naming the cause otherwise.
  using DoneCallback = std::function<void(const absl::Status&, const PlanProgress&)>;
  using WatchFn = std::function<void(const PlanProgress&)>;

  PlanManager(const Clock* clock, Timer* timer, WorkerManager* workers, MeshManager* meshes,
              TensorManager* tensors, WorkerClient* client, PlanManagerOptions options = {});
  ~PlanManager() override;

  // Moves `tensor` to `target` (on target.mesh, or the tensor's mesh when empty).
  // NOT_FOUND tensor or mesh; INVALID_ARGUMENT a spec the tensor cannot take; ABORTED busy;
  // FAILED_PRECONDITION a chunk with no live replica or a dead worker in the target;
  // RESOURCE_EXHAUSTED its memory can never fit a worker's budget (options.admission; every
  // plan and group: the plan may also start, wait for memory and end with that code).
  absl::StatusOr<StartedPlan> Redistribute(const std::string& tensor, const Spec& target,
                                           DoneCallback done);
  // Every rank of `mesh` (empty: the tensor's) ends with the whole tensor, or only
  // `to_rank` when given (the tensor then lives on that rank alone, on no mesh).
  absl::StatusOr<StartedPlan> Gather(const std::string& tensor, const std::string& mesh,
                                     std::optional<int64_t> to_rank, DoneCallback done);
  // Writes `src`'s values into `dst` (same shape and dtype, any mesh and layout): a plan
  // from src's layout to dst's that reads src's committed buffers and writes dst's new
  // version. dst keeps its layout; src is not modified; both are busy until the plan ends.
  // INVALID_ARGUMENT src == dst or a different shape or dtype; NOT_FOUND either; ABORTED
  // either busy; FAILED_PRECONDITION a chunk of src with no live replica or a dead worker
  // holding dst.
  absl::StatusOr<StartedPlan> Copy(const std::string& src, const std::string& dst,
                                   DoneCallback done);
  // Many Copies as one transaction and one fused plan. Each member is planned as a Copy and
  // keeps its own plan id (Progress, Watch, List, Trace and metrics see it), but the workers
  // get one fragment per worker for the whole group (the group's id, every member's section,
  // sharding/fused_stream.h cuts the transfers between each pair of ranks into buckets) and
  // send one report each. Every member is validated on its own (CheckReports); none commits
  // before every member has validated, and then all dsts get their new versions in one
  // TensorManager::CommitAll, so no reader sees some of them new and others old. Any failure
  // (a worker error or death, a member that does not validate, the plan timeout) aborts the
  // whole group; then every dst keeps its old version. All tensors are acquired before any
  // fragment is sent. Errors as Copy's, and CheckCopyGroup's, each message prefixed with
  // "copies[i]"; a refused group changes nothing. `done` runs once, after every member ended.
  using GroupDoneCallback = std::function<void(const absl::Status&, const GroupProgress&)>;
  absl::StatusOr<StartedGroup> CopyGroup(const std::vector<CopyMember>& copies,
                                         GroupDoneCallback done);
  // Many Redistributes as one transaction, as CopyGroup: every tensor gets its new layout
  // and version together, or none does. Errors as Redistribute's and CheckRedistributeGroup's,
  // prefixed with "redistributes[i]" (a bad spec: "redistributes[i].target...").
  absl::StatusOr<StartedGroup> RedistributeGroup(const std::vector<RedistributeMember>& members,
                                                 GroupDoneCallback done);
  // A checkpoint load's exchange as one group: every member a copy into its `into` tensor or
  // a move of its staging tensor to its target, committed together; staging tensors are those
  // `owner` hides, and the moved ones are published (visible, stored) by the commit. Errors as
  // CopyGroup's and RedistributeGroup's, prefixed with "tensors[i]" (op "load" in metrics).
  absl::StatusOr<StartedGroup> LoadGroup(const std::string& owner,
                                         const std::vector<LoadMember>& members,
                                         GroupDoneCallback done);
  // Many Gathers (to every rank of `mesh`, empty: each tensor's own; or to `to_rank`) as one
  // group, as RedistributeGroup. Errors as Gather's and CheckGatherGroup's, prefixed with
  // "tensors[i]".
  absl::StatusOr<StartedGroup> GatherGroup(const std::vector<std::string>& tensors,
                                           const std::string& mesh, std::optional<int64_t> to_rank,
                                           GroupDoneCallback done);

  // Restores a tensor's own layout (same mesh, spec and ranks) from the chunks still live:
  // ranks that lost their copy (a worker that died and registered again) get it back from a
  // live replica. Run for a leaving worker (coordinator/cluster/worker_drain.h); unlike other plans
  // it may use workers that are leaving. Errors as Redistribute's.
  absl::StatusOr<StartedPlan> Repair(const std::string& tensor, DoneCallback done);

  // How many plans run now.
  size_t RunningPlansCount() const;
  // Ids of the running plans `rank` takes part in.
  std::vector<std::string> RunningPlansOf(int64_t rank) const;

  // The plan Redistribute would run, without running it.
  absl::StatusOr<StartedPlan> DryRun(const std::string& tensor, const Spec& target);

  // NOT_FOUND unknown plan; ABORTED stale incarnation or plan already ended;
  // INVALID_ARGUMENT a rank that takes no part. A report with an error aborts the plan
  // (after the failure grace) and returns OK: the report was taken.
  absl::Status Report(const WorkerReport& report);

  absl::StatusOr<PlanProgress> Progress(const std::string& plan_id) const;
  // The plan's timeline so far: phases and each rank's reported steps. NOT_FOUND. A group's
  // id gives the fused plan's timeline (its exchange rounds per rank, op "group"); a group
  // member's id gives the same rank tracks under the member's id, tensor and op.
  absl::StatusOr<v1::PlanTrace> Trace(const std::string& plan_id) const;
  // Up to `limit` plans, running and kept ended ones, newest first.
  std::vector<v1::PlanSummary> List(size_t limit) const;
  // Calls `fn` with the current progress and on every change until the plan ends (the last
  // call has ended() true). Returns a watch id for Unwatch; NOT_FOUND unknown plan.
  absl::StatusOr<int64_t> Watch(const std::string& plan_id, WatchFn fn);
  // After it returns, `fn` is not called again... except by a call already running.
  void Unwatch(const std::string& plan_id, int64_t watch_id);

  // Aborts `plan_id` with `reason` (no-op when it ended or is committing).
  void Abort(const std::string& plan_id, const std::string& reason);
  // Aborts every running plan.
  void AbortAll(const std::string& reason);
  // Aborts every running plan and refuses new ones with UNAVAILABLE (shutdown).
  void Shutdown(const std::string& reason);
  // Refuses new plans with UNAVAILABLE `reason` and lets running ones go on (a draining
  // coordinator; Shutdown aborts what is left).
  void Close(const std::string& reason);
  // Blocks until no plan runs or `deadline` (real time) passes; true when none runs. For the
  // daemon's main thread, never a reactor.
  bool AwaitIdle(absl::Time deadline);

  // Aborts the running plans that read `rank`'s chunks of `tensor`, or write them in place
  // (a Copy into an attached tensor): the buffer a user process lent for them is gone.
  void AbortUsing(const std::string& tensor, int64_t rank, const std::string& reason);

  // WorkerListener: aborts the running plans the lost incarnation takes part in.
  void OnWorkerLost(const WorkerRecord& worker, const std::string& reason) override;

  // Plan cache statistics.
  int64_t cache_hits() const;
  int64_t cache_misses() const;

 private:
  struct Target {
    Layout layout;
    std::string mesh;  // Empty: on no named mesh.
    std::string spec;
    // A redistribute that casts the tensor to this dtype (a checkpoint load with a dtype);
    // empty: the tensor keeps its dtype. A Copy's target dtype is always dst's.
    std::optional<DType> dtype;
  };
  using TargetFn = std::function<absl::StatusOr<Target>(const TensorRecord&)>;
  using WatchCalls = std::vector<std::pair<WatchFn, PlanProgress>>;

  // One worker of a transaction (what it was sent and answered) or, in a plan record, one
  // rank of that plan (what it reported of the plan's chunks).
  struct Participant {
    WorkerEndpoint endpoint;
    bool executed = false;
    bool reported = false;
    int64_t bytes_done = 0;
    int64_t bytes_expected = 0;  // What this rank receives.
    RankChunks chunks;
    ChunkChecksums checksums;
    v1::RankTrace timing;  // From its final report (a transaction's participant).
  };

  // How a transaction's data moves (what Send does).
  enum class Strategy {
    kCollective,  // One member; its own fragment per participant (MakeFragments, not fused).
    kFused,       // Many members; one fused fragment per worker under the transaction's id.
    kRelay,       // One small member; the coordinator moves it itself (plan_relay.h).
  };

  // One member of a transaction: a plan with its own id (Progress, Watch, List, Trace and
  // metrics see it), what it moves and who waits for it. Its state, error and times are its
  // view of its transaction's (a group member's error names its group).
  struct PlanRecord {
    std::string id;
    const char* op = "";        // For metrics.
    std::string txn;            // Its transaction's id: `id` itself for a single plan.
    std::string owner;          // Non-empty: a checkpoint load's plan; its target is published
    bool keep_hidden = false;   // ... unless this (LoadMember::keep_hidden).
    std::string tensor;         // Read at source_version.
    std::string target_tensor;  // Written at target_version: `tensor` unless a Copy.
    std::shared_ptr<const Plan> plan;
    std::string target_mesh;
    std::string target_spec;
    int64_t source_version = 0;
    int64_t target_version = 0;
    int64_t old_target_version = 0;  // target_tensor's version before; dropped on commit.
    // A Copy into an attached tensor: its lent buffers are written in place, and it stays
    // attached on commit.
    bool target_attached = false;
    std::string communicator_prefix;
    PlanState state = PlanState::kPending;
    bool closing = false;  // Validated, committing: no longer abortable.
    std::string error;
    std::map<int64_t, Participant> participants;  // The ranks of its plan.
    absl::Time start;
    absl::Time transferred = absl::InfinitePast();  // Every final report in.
    absl::Time end = absl::InfiniteFuture();
    std::vector<DoneCallback> done;
    std::map<int64_t, WatchFn> watchers;
    int64_t seq = 0;
    bool completed = false;  // Callbacks and watchers have had the final state.
    // Memory admission: what the plan allocates on its workers (its transaction holds the
    // ticket), its bucket once admitted, why it waits.
    MemoryDemand demand;
    int64_t bucket_bytes = 0;
    std::string waiting_for_memory;
    bool relay = false;  // Small enough for Strategy::kRelay.

    bool ended() const { return state == PlanState::kCommitted || state == PlanState::kAborted; }
    // A member of a transaction of several plans (a group: CopyGroup, ...).
    bool shared() const { return txn != id; }
  };

  // What moves as one: every member commits, or none does. A single plan is a transaction of
  // one member under the plan's id; a group one of many under its own id, run on the workers
  // as one fused plan (one fragment, one report and one FinishPlan per worker). The record
  // owns the transitions below; PlanManager does, outside the lock, what they return.
  struct Transaction {
    std::string id;
    Strategy strategy = Strategy::kCollective;
    std::vector<std::string> members;  // Plan ids, in order.
    std::vector<std::string> labels;   // A group's: "copies[i] ('src' -> 'dst', plan p-3)".
    // The members' records, set when it is sent (a single plan's at once); valid while it
    // runs (members are not retired before their transaction is over).
    std::vector<PlanRecord*> records;
    std::map<int64_t, Participant> participants;  // Every worker of any member.
    int64_t executed = 0;
    int64_t reported = 0;
    // Fragments dispatched. A single plan counts as sent from its start: an abort tells its
    // workers even before its fragments went.
    bool sent = false;
    bool failed = false;   // Aborted (every member is aborted with it).
    bool closing = false;  // Validated, committing: no longer abortable.
    bool over = false;     // Every member ended; kept for traces.
    std::string failing;   // First worker error, while in the failure grace.
    std::string error;
    absl::StatusCode error_code = absl::StatusCode::kAborted;  // Its members' callbacks get it.
    PlanState state = PlanState::kPending;
    absl::Time start;
    absl::Time transferred = absl::InfinitePast();
    absl::Time end = absl::InfiniteFuture();
    Timer::Id timer = 0;
    Timer::Id grace_timer = 0;
    int64_t admission_ticket = 0;  // Its memory, admitted as one.
    std::string communicator_prefix;
    // The fused plan's bucket (the admitted one, else default_bucket_bytes) and messages.
    int64_t default_bucket_bytes = 0;  // The smallest --bucket-bytes of its workers.
    int64_t bucket_bytes = 0;
    int64_t buckets = 0;
    // A group's end (OnMemberDone): each member's final progress, how many ended, its
    // caller, and the epoch's rendezvous prefix once no plan uses it, when a member retired it.
    std::vector<std::optional<PlanProgress>> finals;
    size_t ended = 0;
    GroupDoneCallback done;
    std::string retired_prefix;

    bool fused() const { return strategy == Strategy::kFused; }
    // Neither aborted, committing nor over: worker answers still count.
    bool open() const { return !failed && !closing && !over; }
    // ABORTED "plan ID already ended (STATE)" unless open.
    absl::Status EndedError() const;
    // A member's failure as the transaction's reason: named by its label in a group.
    std::string Qualify(size_t member, const std::string& message) const;
    // "group ID: REASON" for a group's members; a single plan's is the reason itself.
    std::string MemberReason(const std::string& reason) const;
    // The participant a report comes from, once it passed the checks every report gets (a
    // rank of the transaction, not stale); a final report's timing is kept.
    absl::StatusOr<Participant*> Reporter(const WorkerReport& report);
    // Marks `rank`'s fragment accepted: PENDING -> PREPARED once every one was. False when
    // it was already.
    bool MarkExecuted(int64_t rank);
    // Counts `p`'s final report.
    void MarkReported(Participant& p);
    // Every fragment accepted, every final report in, no worker failing: TRANSFERRED (at
    // `now`), and true: validation may start.
    bool MaybeTransferred(absl::Time now);
    // The first abort (true) or a repeat (false): marks it failed at `now` with `reason`.
    bool MarkAborted(const std::string& reason, absl::StatusCode code, absl::Time now);
    // Its timeout and grace timers, for the caller to cancel outside the lock; none is left.
    std::vector<Timer::Id> TakeTimers();
    // "worker w1 (rank 1) (no final report), ...", or "validation": what a timeout waited for.
    std::string Waiting() const;
  };

  // The workers as one plan (or a whole group) sees them: one copy under WorkerManager's lock
  // instead of one per rank and member. A worker that dies meanwhile aborts the plan through
  // OnWorkerLost, as it would after any lookup.
  struct WorkerView {
    std::vector<WorkerRecord> workers;  // Index = rank.
    std::vector<std::string> hosts;     // Index = rank (PlanOptions::hosts_by_rank).
    // NOT_FOUND as WorkerManager::GetByRank.
    absl::StatusOr<const WorkerRecord*> ByRank(int64_t rank) const;
    // The one liveness query of the plans: whether `rank` is alive at `incarnation` in this
    // view (valid while the view is).
    LivenessFn Liveness() const;
  };
  WorkerView ViewWorkers() const;

  // What a group's members share while they start, one after another (StartGroup): the last
  // member's plan and what follows from it alone. A model's layers are mostly equal tensors
  // moved alike, so the next member reuses them after comparing its inputs (no fingerprints,
  // no plan cache lookup, no recount of the same layouts).
  struct GroupMemo {
    // The plan of `source` -> `target` in `dtype` (with the group's worker view).
    std::shared_ptr<const Plan> plan;
    DType dtype = DType::kF32;
    DType target_dtype = DType::kF32;  // The target tensor's (a Copy may cast).
    Layout source;
    Layout target;
    std::vector<int64_t> participants;  // PlanParticipants(*plan).
    // PlanMemoryDemand(*plan, in_place, in_place ? nullptr : &replaced, false), when
    // demand_plan is plan.
    const Plan* demand_plan = nullptr;
    bool in_place = false;
    Layout replaced;
    MemoryDemand demand;
  };

  // How Start places a plan. Default: a single plan, a transaction of its own. With `txn`,
  // a member of that (running, not yet sent) group transaction, planned with its worker view
  // and its memo, which Start updates.
  struct MemberInput {
    std::string txn;
    std::string communicator_prefix;  // The group's.
    const WorkerView* workers = nullptr;
    GroupMemo* memo = nullptr;
    std::string owner;  // Hidden tensors it may use (a checkpoint load).
    bool keep_hidden = false;
  };
  // A started member: its plan and the smallest --bucket-bytes of its workers.
  struct StartedMember {
    StartedPlan plan;
    int64_t bucket_bytes = 0;
  };

  // What committing a member takes once it no longer changes (closing).
  struct CommitWork {
    std::string id;
    std::string tensor;
    std::string target_tensor;
    TensorManager::NewState state;  // Moved into the CommitAll item (Validate).
    std::vector<int64_t> ranks;     // Its participants.
    int64_t old_target_version = 0;
  };

  absl::StatusOr<std::shared_ptr<const Plan>> MakePlan(const TensorRecord& tensor,
                                                       const Layout& source, const Layout& target,
                                                       std::vector<std::string> hosts_by_rank,
                                                       std::optional<DType> target_dtype = {});
  absl::StatusOr<Target> ResolveSpec(const TensorRecord& tensor, const Spec& spec) const;
  // Plans from `tensor`'s layout to target_fn's (given the record of `target_tensor`) and
  // stores the plan; the new version belongs to `target_tensor`, which is `tensor` itself
  // except for a Copy. `op` names the operation in metrics ("redistribute", "gather",
  // "copy"). A single plan (no input.txn) gets its transaction and timer; nothing is sent.
  absl::StatusOr<StartedMember> StartMember(const char* op, const std::string& tensor,
                                            const std::string& target_tensor,
                                            const TargetFn& target_fn, DoneCallback done,
                                            const MemberInput& input);
  // A single plan: StartMember, then admitted and sent.
  absl::StatusOr<StartedPlan> Start(const char* op, const std::string& tensor,
                                    const std::string& target_tensor, const TargetFn& target_fn,
                                    DoneCallback done);
  // Asks admission for `demand` on behalf of transaction `txn` (`what` names it), and sends
  // it with the bucket size admission chose (0 without admission: the workers' default), now
  // or once admitted; a later refusal (the admission timeout) aborts it with
  // RESOURCE_EXHAUSTED. A refusal at once is returned: nothing was sent, the caller forgets
  // the transaction.
  absl::Status AdmitAndSend(const std::string& what, const std::string& txn, MemoryDemand demand);
  // The one dispatch: the strategy decides what goes to the workers (each member's own
  // fragments, the fused fragments, or the coordinator's relay); plan_dispatch.cc's
  // MakeFragments is the only place fragments are made.
  void Send(const std::string& txn, int64_t admitted_bucket_bytes);
  // Aborts `txn` after plan_timeout from its start ("group ID timed out ..." for a group).
  void ScheduleTimeoutLocked(Transaction& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A relayed plan's data step (RunRelay); its outcome stands in for the workers' reports.
  void Relay(const std::string& id);
  void OnRelayDone(const std::string& id, const std::map<int64_t, WorkerEndpoint>& workers,
                   RelayResult result);
  // Aborts plan `id`'s transaction (named by the plan's label in a group) with the status
  // code the members' callbacks get (ABORTED, or RESOURCE_EXHAUSTED when it never got memory).
  void AbortWith(const std::string& id, const std::string& reason, absl::StatusCode code);
  // Aborts every member of `txn` not ended yet (idempotent; a no-op once it is committing).
  void AbortTransaction(const std::string& txn, const std::string& reason,
                        absl::StatusCode code = absl::StatusCode::kAborted);
  // Forgets a started plan whose fragments were never sent: releases its tensors (and its
  // own transaction, for a single plan).
  void Discard(const std::string& id);
  struct GroupItem {
    const char* op = "";  // "copy", "redistribute".
    std::string tensor;
    std::string target_tensor;
    TargetFn target_fn;
    std::string where;  // "copies[2]"
    std::string label;  // "copies[2] ('a' -> 'b'"; the plan id and ")" are added.
    std::string owner;  // Hidden tensors it may use (a checkpoint load).
    bool keep_hidden = false;
  };
  // Starts every item (fragments held back), then sends them all; on a refusal forgets the
  // items started so far and returns it prefixed with the item's `where`.
  absl::StatusOr<StartedGroup> StartGroup(const std::vector<GroupItem>& items,
                                          GroupDoneCallback done);
  void OnMemberDone(const std::string& txn, size_t index, const absl::Status& status,
                    const PlanProgress& progress);
  // The target of a Gather (to every rank of `mesh`, empty: the tensor's; or to `to_rank`).
  absl::StatusOr<Target> GatherTarget(const TensorRecord& rec, const std::string& mesh,
                                      std::optional<int64_t> to_rank) const;
  // Members' states follow their transaction's. A group's members each tell their watchers
  // of a change; a single plan's are told once per worker answer by its caller.
  void MembersToLocked(const Transaction& t, PlanState state, WatchCalls* calls)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Under mu_: marks the member closing and gathers what committing it takes.
  CommitWork BeginCommitLocked(PlanRecord& e, LayoutChecksums checksums)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the tensor manager committed: marks the members committed, completes them (the
  // callers are answered) and then tells the workers to drop old buffers, without waiting.
  void EndCommit(const std::string& txn, std::vector<CommitWork> work);
  // INVALID_ARGUMENT naming both when a Copy's tensors differ in shape or dtype.
  static absl::Status CheckCopyable(const TensorRecord& src, const TensorRecord& dst);
  // Ends the plan's hold on its tensors without changes.
  void ReleaseTensors(const std::string& tensor, const std::string& target_tensor,
                      const std::string& id, const std::string& target_mesh);

  // A worker's error: the reason to abort at once (no failure grace), or "" with the grace
  // started (*start_grace) by the first error (*failing).
  std::string FailingLocked(const Participant& p, const WorkerReport& report, std::string* failing,
                            bool* start_grace) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // After the failure grace, aborts the transaction with its first error.
  void StartGrace(const std::string& txn);
  // A final report's chunks, as the strategy reported them: a member's own (a single plan's
  // report) or each member's section of the fused report, matched against each member's
  // target for the rank as they come in. The reason to abort, or "".
  std::string RecordChunksLocked(Transaction& t, Participant& p, const WorkerReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  void OnExecuteDone(const std::string& txn, int64_t rank, const absl::Status& status);
  // Runs when every fragment was accepted and every final report is in: every member
  // validates, then all commit in one CommitAll; else the transaction aborts.
  void Validate(const std::string& txn);
  // A member's new layout's checksums, or why its reports do not validate. `checked`: its
  // chunks were matched against the plan as the reports came in (a fused report).
  static absl::StatusOr<LayoutChecksums> CheckReports(const PlanRecord& e, bool checked);
  void Complete(const std::string& id, const absl::Status& status);
  // Admission tickets outlive their transactions until the workers have dropped what the
  // plans replaced: a FinishPlan in flight holds the transaction's ticket, whose release
  // waits for the last hold. Without this a plan admitted right after a commit could reach a
  // worker before that worker dropped the old version, and find its budget still full.
  int64_t HoldTicketLocked(const Transaction& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unhold(int64_t ticket);
  void ReleaseTicket(int64_t ticket);
  // Sends each worker its request; the hold on `ticket` goes when every answer is in.
  void FinishOnWorkers(std::vector<std::pair<WorkerEndpoint, v1::FinishPlanRequest>> requests,
                       int64_t ticket);

  PlanProgress ProgressLocked(const PlanRecord& e) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool IdleLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bumps seq and returns what to tell watchers.
  WatchCalls ChangedLocked(PlanRecord& e) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A plan that has not completed meets under rendezvous `prefix`.
  bool EpochInUseLocked(const std::string& prefix) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `prefix` then `n`, with the id namespace and a '.' between when there is one ("p-3",
  // "p-<ns>.3").
  std::string Namespaced(absl::string_view prefix, int64_t n) const;
  std::string CommPrefixLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Tell(const WatchCalls& calls);

  const Clock* const clock_;
  Timer* const timer_;
  WorkerManager* const workers_;
  MeshManager* const meshes_;
  TensorManager* const tensors_;
  WorkerClient* const client_;
  const PlanManagerOptions options_;

  mutable absl::Mutex cache_mu_;
  PlanCache cache_ ABSL_GUARDED_BY(cache_mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, PlanRecord> plans_ ABSL_GUARDED_BY(mu_);
  // Running and kept transactions: a single plan's goes with its record; a group's is kept
  // as long as keep_ended_plans other groups allow (ended_groups_).
  std::map<std::string, Transaction> transactions_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_groups_ ABSL_GUARDED_BY(mu_);
  int64_t next_group_ ABSL_GUARDED_BY(mu_) = 1;
  std::deque<std::string> ended_ ABSL_GUARDED_BY(mu_);
  int64_t next_plan_ ABSL_GUARDED_BY(mu_) = 1;
  // Communicators are reused across plans: their rendezvous prefix is per epoch, not per
  // plan, and the epoch moves on after every abort, because after a failure some members may
  // hold broken communicators and others healthy ones, and only new keys meet again.
  int64_t comm_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  // Rendezvous prefixes of epochs an abort retired while other plans still used them.
  std::set<std::string> retired_epochs_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int> ticket_holds_ ABSL_GUARDED_BY(mu_);   // Ticket -> FinishPlans out.
  std::set<int64_t> tickets_to_release_ ABSL_GUARDED_BY(mu_);  // Ended, waiting for holds.
  int64_t next_watch_ ABSL_GUARDED_BY(mu_) = 1;
  std::string closed_ ABSL_GUARDED_BY(mu_);  // Why new plans are refused, after Shutdown.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_PLANS_PLAN_MANAGER_H_
