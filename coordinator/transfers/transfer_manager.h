#ifndef SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_MANAGER_H_
#define SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_MANAGER_H_

// Prepared transfers (issue 27): a weight-sync step (a CopyGroup that repeats every RL step)
// checked, planned and admitted once, resident on its workers, and run with O(ranks) small
// messages. See docs/architecture.md "Prepared transfers".
//
// The coordinator never expands a transfer into plans: it sends every participant the same
// table (sharding/transfer_table.h: each member's names, versions and the index of its src
// and dst layout among the distinct ones) and each worker plans its own part
// (ExpandTransfer). A run is one RunTransfer and one FinishPlan per participant, one admission
// ticket, one durable record and one flag on the tensor manager (TensorManager::
// StartTransferRun / CommitTransferRun): nothing in it grows with the member count.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/thread_pool.h"
#include "common/timer.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/admission.h"
#include "coordinator/plans/coordinator_metrics.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "coordinator/store/state_store.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

struct TransferManagerOptions {
  // A run that has not ended by then is aborted; also each RunTransfer's deadline.
  absl::Duration run_timeout = absl::Minutes(5);
  // Given to workers for each communication step.
  absl::Duration step_timeout = absl::Minutes(5);
  // As PlanManagerOptions::failure_grace: after a worker's error the run waits this long
  // before it aborts, so that a participant's death in that window is what it names.
  absl::Duration failure_grace = absl::ZeroDuration();
  // As PlanManagerOptions::id_namespace (new on every start with a durable state): transfer
  // ids "NAME@<ns>.<n>" (one per preparation) and run ids "t-<ns>.<n>" never repeat ones
  // workers may still hold from before a restart.
  std::string id_namespace;
  // About the bytes of one PrepareTransfer page and of one stored page of copies (etcd
  // refuses values over 1.5 MiB).
  int64_t page_bytes = int64_t{1} << 20;
  size_t max_members = 100000;
  // Ended runs kept for Progress, WatchPlan, ListPlans and GetPlanTrace.
  size_t keep_ended_runs = 256;
  // Threads that run a preparation's CPU work (the snapshot, the table, its pages), so that
  // no gRPC reactor does; 0: on the caller's thread (tests).
  int prepare_threads = 0;
  // Memory admission of each run (not owned; null: none, workers' default buckets).
  AdmissionController* admission = nullptr;
  // shardcoord_transfer_* families (not owned; may be null).
  CoordinatorMetrics* metrics = nullptr;
  // Called when a run ended (committed or aborted), for the log.
  std::function<void(const PlanProgress& final)> on_run_end;
  // Called with a rendezvous key prefix no run will use again (after an aborted run, a new
  // preparation, a delete): the daemon deletes those keys from its KvStore.
  std::function<void(const std::string& prefix)> on_prefix_retired;
};

// Named prepared transfers: create (check, bind, prepare, store), run, get, list, delete.
// Thread-safe; no lock is held while calling workers, the tensor manager, admission or
// callbacks. Also a WorkerListener: a participant's death (or new registration) invalidates
// the transfers it takes part in (the next run prepares again) and aborts their running run.
class TransferManager : public WorkerListener {
 public:
  TransferManager(const Clock* clock, Timer* timer, WorkerManager* workers, TensorManager* tensors,
                  WorkerClient* client, StateStore* store, TransferManagerOptions options = {});
  ~TransferManager() override;

  // Loads the stored transfers, each bound to its members at its last committed version and
  // not prepared (its first run prepares). Call once, after TensorManager::Load and before
  // workers register (their reconcile reads dsts' versions through the bindings). INTERNAL
  // for a record that does not parse.
  absl::Status Load();

  // Checks `copies` as CopyGroup does (errors name "copies[i]..."), binds and prepares them
  // on their workers and stores the transfer, all or nothing; `done` gets its info.
  // INVALID_ARGUMENT a bad name, no copies or more than max_members, a name twice, a shape
  // mismatch or dtypes that may not be cast (a dst of another dtype converts, as a Copy's);
  // ALREADY_EXISTS the name; NOT_FOUND a tensor; ABORTED a tensor busy; FAILED_PRECONDITION a chunk
  // with no live replica or a dead worker holding a dst; RESOURCE_EXHAUSTED a run can never fit a
  // worker's memory; UNAVAILABLE a worker did not take its part (then none keeps one). `done` may
  // run before Create returns.
  using InfoCallback = std::function<void(absl::StatusOr<v1::TransferInfo>)>;
  void Create(const std::string& name, std::vector<TransferCopy> copies, InfoCallback done);

  // Runs the transfer once. `started` runs once: with the run (PENDING, its run_id) when it
  // was admitted or waits for memory, or with the error that kept it from starting; then,
  // only after a started run, `ended` runs once with its end (OK: COMMITTED; ABORTED naming
  // why, every dst at its old version). An invalid transfer is prepared again first
  // (`replanned`). NOT_FOUND; FAILED_PRECONDITION a member deleted (named) or lost;
  // ABORTED a member busy (named), the transfer running; RESOURCE_EXHAUSTED as a plan's;
  // UNAVAILABLE a participant not registered.
  using RunCallback = std::function<void(const absl::Status&, const v1::RunTransferResponse&)>;
  void Run(const std::string& name, RunCallback started, RunCallback ended);

  // NOT_FOUND (also while it is being created).
  absl::StatusOr<v1::TransferInfo> Get(const std::string& name, bool with_copies) const;
  // Up to `limit` transfers after `after` in name order (without copies); `more`: others
  // follow.
  struct Page {
    std::vector<v1::TransferInfo> transfers;
    bool more = false;
  };
  Page List(absl::string_view after, size_t limit) const;
  // Forgets the transfer (its dsts keep the version its last run gave them) and tells every
  // live worker to drop its parts. NOT_FOUND; ABORTED while it runs or is being created; the
  // store's error (then nothing changed).
  absl::Status Delete(const std::string& name);

  // Runs, as plans are seen (run ids "t-..."): WatchPlan, ListPlans and GetPlanTrace.
  using WatchFn = std::function<void(const PlanProgress&)>;
  bool IsRun(const std::string& id) const;
  absl::StatusOr<PlanProgress> Progress(const std::string& run_id) const;
  // As PlanManager::Watch: the current progress, then every change until it ended.
  absl::StatusOr<int64_t> Watch(const std::string& run_id, WatchFn fn);
  void Unwatch(const std::string& run_id, int64_t watch_id);
  absl::StatusOr<v1::PlanTrace> Trace(const std::string& run_id) const;
  // The newest `limit` runs, newest first (op "transfer").
  std::vector<v1::PlanSummary> ListRuns(size_t limit) const;
  size_t RunningCount() const;

  // WorkerListener: invalidates the transfers `worker` takes part in; aborts their runs.
  void OnWorkerLost(const WorkerRecord& worker, const std::string& reason) override;
  // Refuses new creates and runs with UNAVAILABLE `reason`; running runs go on (a draining
  // coordinator; Shutdown aborts what is left).
  void Close(const std::string& reason);
  // Aborts running runs and refuses new creates and runs with UNAVAILABLE `reason`.
  void Shutdown(const std::string& reason);

 private:
  // One participant's part, as its last PrepareTransfer answer said.
  struct Part {
    int64_t bytes_sent = 0;
    int64_t bytes_received = 0;
    int64_t target_bytes = 0;
    uint64_t replica_key = 0;
  };
  // What one preparation left on the workers. Immutable once made (runs share it).
  struct Prepared {
    std::string id;                            // "NAME@N": the workers' key of their resident part.
    int64_t generation = 0;                    // The members' (TensorManager) it was made from.
    std::vector<WorkerEndpoint> participants;  // By rank.
    std::vector<Part> parts;                   // Same index.
    int64_t templates = 0;
    int64_t layouts = 0;
    int64_t bytes = 0;
    int64_t bytes_moved = 0;
    int64_t lower_bound_bytes = 0;
    int64_t max_rank_send_bytes = 0;
    int64_t max_rank_recv_bytes = 0;
    int64_t default_bucket_bytes = 0;  // The smallest --bucket-bytes of its participants.
    MemoryDemand demand;               // A run's: new dst buffers, staging, what commit frees.
    double seconds = 0;
    // Dsts a run gives back a buffer their holder lost (TransferCommit::repaired).
    std::vector<std::string> repaired;
  };
  struct Transfer {
    std::string name;
    TransferCopies copies;
    bool stored = false;  // False while being created.
    int64_t runs = 0;
    int64_t replans = 0;
    int64_t version = 0;
    std::shared_ptr<const Prepared> prepared;  // The last preparation, null before the first.
    // Why `prepared` may not run (a participant lost, the last run aborted); "" when it may.
    std::string invalid;
    // What holds it: "creating", "deleting" or the run (which may be preparing it first).
    std::string busy;
    // The participants of a preparation in flight, and why it fails when one of them was lost
    // meanwhile.
    std::vector<WorkerEndpoint> preparing;
    std::string lost_while_preparing;
    int64_t pages_stored = 0;  // Its stored pages of copies.
    int64_t comm_epoch = 0;    // Moves after every aborted run: new rendezvous keys.
    std::string last_run_id;
    PlanState last_run_state = PlanState::kPending;
    double last_run_seconds = 0;
    std::string last_error;
  };
  struct RunRecord;
  struct PrepareJob;

  // Prepares `name` (bound, held by `holder`) on its workers: snapshot, table, pages, answers.
  // `done` gets the preparation (not yet installed) or why it failed; its parts are dropped
  // then. Runs the CPU work on the executor.
  using PreparedCallback = std::function<void(absl::StatusOr<std::shared_ptr<const Prepared>>)>;
  void Prepare(const std::string& name, PreparedCallback done);
  void PrepareNow(const std::string& name, PreparedCallback done);
  void SendPage(std::shared_ptr<PrepareJob> job, size_t page);
  void FinishPrepare(std::shared_ptr<PrepareJob> job, absl::Status status);
  // Tells `workers` to forget the resident parts `request` names, without waiting.
  void DropParts(const std::vector<WorkerEndpoint>& workers,
                 const v1::DropTransferRequest& request);

  void CreatePrepared(const std::string& name,
                      absl::StatusOr<std::shared_ptr<const Prepared>> prepared, InfoCallback done);
  // Forgets a transfer whose create failed.
  void ForgetCreating(const std::string& name);

  // The run's next step once it holds the transfer: prepared and valid -> start; else prepare.
  void RunPrepared(const std::string& run_id);
  void OnRunPrepared(const std::string& run_id,
                     absl::StatusOr<std::shared_ptr<const Prepared>> prepared);
  void StartRun(const std::string& run_id);
  void Dispatch(const std::string& run_id, int64_t bucket_bytes);
  void OnRunAnswer(const std::string& run_id, size_t index,
                   absl::StatusOr<v1::RunTransferWorkerResponse> answer);
  void ValidateRun(const std::string& run_id);
  // Ends a run that never started (it never held the members): `started` hears `status`.
  void FailBeforeStart(const std::string& run_id, const absl::Status& status);
  // Aborts a started run (no-op once it ended or commits).
  void AbortRun(const std::string& run_id, const std::string& reason,
                absl::StatusCode code = absl::StatusCode::kAborted);
  void StartGrace(const std::string& run_id);
  void TimedOut(const std::string& run_id);
  // FinishPlan(run_id, commit) to every worker; `then` (optional) once each answered or
  // failed, after the admission ticket went back.
  void FinishOnWorkers(const std::vector<WorkerEndpoint>& workers, const std::string& run_id,
                       bool commit, int64_t ticket, std::function<void()> then = nullptr);

  // The transfer's durable header (kind "transfer"): what a run rewrites.
  StateRecord HeaderLocked(const Transfer& t, int64_t version, int64_t runs) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::TransferInfo InfoLocked(const Transfer& t, const TransferBindingState* binding) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why `t`'s preparation may not run now, "" when it may.
  std::string InvalidLocked(const Transfer& t, const TransferBindingState& binding) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PlanProgress ProgressLocked(const RunRecord& r) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  using WatchCalls = std::vector<std::pair<WatchFn, PlanProgress>>;
  WatchCalls ChangedLocked(RunRecord& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireRunLocked(const std::string& run_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A started run's end (CommitRun, AbortRun), in two steps under mu_: EndRunLocked closes
  // `r` in `state` and records it as `t`'s last run (`error`: "" when none), taking its timers
  // and ticket; once the caller changed `t` and `r` for its kind of end, RetireEndedRunLocked
  // takes the watchers' calls, the final progress and the join, answers `state`, and retires
  // it (`r` may be erased then). After mu_, CancelTimers(end.timers).
  struct RunEnd;
  RunEnd EndRunLocked(RunRecord& r, Transfer& t, PlanState state, const std::string& error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RetireEndedRunLocked(RunRecord& r, const Transfer& t, v1::PlanState state, RunEnd& end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelTimers(const std::vector<Timer::Id>& timers);
  std::string CommPrefixLocked(const Transfer& t, const Prepared& p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static void Tell(const WatchCalls& calls);

  const Clock* const clock_;
  Timer* const timer_;
  WorkerManager* const workers_;
  TensorManager* const tensors_;
  WorkerClient* const client_;
  StateStore* const store_;
  const TransferManagerOptions options_;

  mutable absl::Mutex mu_;
  std::map<std::string, Transfer, std::less<>> transfers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::unique_ptr<RunRecord>> runs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_runs_ ABSL_GUARDED_BY(mu_);
  int64_t next_run_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_preparation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t next_watch_ ABSL_GUARDED_BY(mu_) = 1;
  std::string closed_ ABSL_GUARDED_BY(mu_);  // Why creates and runs are refused (Shutdown).

  // Last: destroyed first, running what it has queued while the rest still stands.
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_TRANSFERS_TRANSFER_MANAGER_H_
