#ifndef SHARDCOORD_COORDINATOR_CLUSTER_WORKER_DRAIN_H_
#define SHARDCOORD_COORDINATOR_CLUSTER_WORKER_DRAIN_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/timer.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"

namespace shardcoord {

// True when `tensor` would lose its last live copy of some chunk with `rank` gone, and
// another rank of its layout that should hold that chunk is alive now (`alive_now`: a
// worker that died and registered again, so it holds nothing of the tensor): a repair plan
// (PlanManager::Repair) saves the chunk there. Pure.
bool NeedsRepairBeforeLeave(const TensorRecord& tensor, int64_t rank, const LivenessFn& live,
                            const std::function<bool(int64_t rank)>& alive_now);

// The chunks of `tensor` that only `rank` holds live: "[0:4, 0:8]; [4:8, 0:8] (partial 1)".
// Empty when none. Pure.
std::string ChunksOnlyOn(const TensorRecord& tensor, int64_t rank, const LivenessFn& live);

// What a leave did (LeaveWorkerResponse).
struct LeaveOutcome {
  std::vector<std::string> aborted_plans;
  std::vector<std::string> repaired_tensors;
  std::vector<std::string> lost;  // "tensor: chunks" lost with the worker.
};

// A draining worker leaving the cluster (CoordinatorWorkers.LeaveWorker, see the proto):
// marked leaving, so new plans refuse it; its running plans get until the drain deadline to
// end, then are aborted; tensors that would lose their last copy of a chunk and have a live
// replica rank that lost its own are repaired first (also bounded by the deadline); then the
// worker is declared dead ("left the cluster") and `done` gets what happened. Event-driven
// (plan watches and one timer), never blocks. gRPC-free. Thread-safe.
class WorkerDrain {
 public:
  using Done = std::function<void(absl::StatusOr<LeaveOutcome>)>;

  WorkerDrain(const Clock* clock, Timer* timer, WorkerManager* workers, TensorManager* tensors,
              PlanManager* plans)
      : clock_(clock), timer_(timer), workers_(workers), tensors_(tensors), plans_(plans) {}
  ~WorkerDrain();
  WorkerDrain(const WorkerDrain&) = delete;
  WorkerDrain& operator=(const WorkerDrain&) = delete;

  // Errors (through `done`, at once): WorkerManager::SetLeaving's; INVALID_ARGUMENT a negative
  // timeout. `done` runs exactly once, on any thread, possibly before Leave returns.
  void Leave(const std::string& name, int64_t incarnation, absl::Duration drain_timeout, Done done);

 private:
  struct Drain {
    WorkerRecord worker;
    absl::Time deadline;
    Timer::Id timer = 0;
    std::map<std::string, bool> plans;  // Running plans it takes part in -> ended.
    bool repairs_started = false;
    bool repairs_starting = false;               // StartRepairs runs: do not finish under it.
    std::map<std::string, std::string> repairs;  // Tensor -> repair plan id ("" starting).
    bool finished = false;
    LeaveOutcome outcome;
    Done done;
  };

  void PlanEnded(int64_t rank, const std::string& plan_id);
  void RepairEnded(int64_t rank, const std::string& tensor, const absl::Status& status);
  void OnDeadline(int64_t rank);
  // Moves on when nothing is awaited: starts the repairs, or finishes.
  void Advance(int64_t rank);
  void StartRepairs(int64_t rank);
  void Finish(int64_t rank);

  const Clock* const clock_;
  Timer* const timer_;
  WorkerManager* const workers_;
  TensorManager* const tensors_;
  PlanManager* const plans_;

  absl::Mutex mu_;
  std::map<int64_t, Drain> drains_ ABSL_GUARDED_BY(mu_);  // By rank.
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_CLUSTER_WORKER_DRAIN_H_
