#ifndef SHARDCOORD_WORKER_CONTROL_TRANSFER_RUNNER_H_
#define SHARDCOORD_WORKER_CONTROL_TRANSFER_RUNNER_H_

// Prepared transfers on a worker (issue 27; docs/architecture.md, "Prepared transfers"): a
// CopyGroup prepared once and run every RL step. The coordinator sends every participant the
// same table pages; on the last page the worker expands its own part (sharding/
// transfer_table.h ExpandTransfer: one fused fragment over every member it takes part in)
// and keeps it resident under the transfer id. A run executes that fragment through
// WorkerCore's one plan runner, as a fused group runs, and answers the RunTransfer itself
// (bytes, a digest of the target checksums, timings) instead of reporting chunks;
// FinishPlan(run id) then commits (each dst's previous version here is dropped and the
// members move to the run's version) or aborts (the run's new buffers are dropped).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/shardcoord.pb.h"
#include "sharding/plan_fragment.h"
#include "worker/buffers/buffer_store.h"
#include "worker/control/worker_core.h"

namespace shardcoord {

// The digest a run answers: StableHash over every member that holds target chunks on this
// rank, in member order, of its table index and its chunks' checksums (`checksums`: per
// fragment member); 0 when none does. Ranks with equal replica keys hold equal values after
// a run exactly when their digests agree.
uint64_t TransferDigest(const Fragment& fragment,
                        const std::vector<std::vector<uint64_t>>& checksums);

// The resident transfers of one worker and their runs. Thread-safe. Owned by WorkerCore
// (`WorkerCore::transfers()`), whose plan runner runs the runs.
class TransferRunner {
 public:
  // `core` runs the runs and says whether the worker accepts work; `buffers` holds the
  // sources checked at preparation and the old versions a commit drops; `identity` gives the
  // rank and incarnation the pages are checked against; `log` (optional) one line per
  // preparation, run start and drop (a run's end and finish are the plan runner's lines,
  // under the run id).
  TransferRunner(WorkerCore* core, BufferStore* buffers, std::function<WorkerIdentity()> identity,
                 std::function<void(absl::string_view)> log = nullptr);
  ~TransferRunner();
  TransferRunner(const TransferRunner&) = delete;
  TransferRunner& operator=(const TransferRunner&) = delete;

  // Appends one page to the table of `page.transfer_id` (page 0 starts it again). Before the
  // last page the answer is empty. On the last page: checks that this worker's incarnation
  // is the one page 0 lists for its rank, expands its part, checks that it holds every
  // source buffer it reads (version, chunks, dtype), keeps the part resident (replacing one
  // of the same id) and answers with what a run does here. `templates` is the number of
  // templates this rank planned and total_bytes_moved / total_lower_bound_bytes this rank's
  // share (RankTransfer::owned_*: summed over the participants they give the transfer's
  // totals); plan_digest is unused (0). The last page takes seconds at 10^5 members: callers
  // run it off any reactor.
  // Errors: INVALID_ARGUMENT a malformed page or table (naming the field; also a layout no
  // member uses) or a page that does not follow the previous page of the same id (`page`;
  // the table is forgotten: send page 0 again); FAILED_PRECONDITION the incarnation or a
  // source buffer (naming tensor and version); UNAVAILABLE draining; the planner's errors
  // naming the member.
  absl::StatusOr<v1::PrepareTransferResponse> Prepare(const v1::PrepareTransferRequest& page);

  using RunDone = std::function<void(absl::StatusOr<v1::RunTransferWorkerResponse>)>;
  // Runs resident transfer `request.transfer_id` once as plan `request.run_id`: every dst
  // written at `request.version` (attached ones in place). `done` is called exactly once:
  // at once when refused, else on the run's thread when this rank's part ended (then
  // FinishPlan(run_id) commits or aborts it). Refusals: INVALID_ARGUMENT a field;
  // NOT_FOUND not resident (prepare again); FAILED_PRECONDITION another rank's run;
  // ABORTED another run of the transfer still holds it (running, or ended and awaiting its
  // FinishPlan: one run at a time), or run_id was finished; UNAVAILABLE draining. A run's
  // own error as WorkerCore's (FAILED_PRECONDITION a source buffer gone, naming the member).
  void Run(const v1::RunTransferWorkerRequest& request, RunDone done);

  // Forgets the resident (and half-paged) transfers named or whose id starts with the
  // non-empty prefix; a run in flight goes on to its FinishPlan. Idempotent. Returns how
  // many resident ones went.
  int Drop(const v1::DropTransferRequest& request);
  // Forgets every transfer (AbortAll: the coordinator invalidated them). Returns how many
  // were resident.
  int ForgetAll();
  // Resident transfers (tests, logs).
  int resident() const;

 private:
  class Resident;
  struct Pending;

  // The last page: the part of this rank, checked.
  absl::StatusOr<v1::PrepareTransferResponse> Expand(const std::string& id, const Pending& pending);
  // FAILED_PRECONDITION naming the first source buffer `fragment` reads that this worker
  // does not hold at its version with the chunks and dtype the fragment expects.
  absl::Status CheckSources(const std::string& id, const Fragment& fragment) const;

  WorkerCore* const core_;
  BufferStore* const buffers_;
  const std::function<WorkerIdentity()> identity_;
  const std::function<void(absl::string_view)> log_;

  mutable absl::Mutex mu_;
  // Tables being paged, by transfer id (a page is parsed outside the lock: the table is taken
  // out meanwhile).
  absl::flat_hash_map<std::string, std::unique_ptr<Pending>> pending_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::shared_ptr<Resident>> resident_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_WORKER_CONTROL_TRANSFER_RUNNER_H_
