#ifndef SHARDCOORD_COORDINATOR_PLANS_ADMISSION_H_
#define SHARDCOORD_COORDINATOR_PLANS_ADMISSION_H_

// Memory admission (issue 10): an operation that allocates on workers (a plan, a group of
// plans, a create, an upload) starts only when what it allocates fits every worker's memory
// budget, counting what the worker holds and what admitted operations have reserved; plans
// otherwise wait in line for memory to be released, up to a timeout. Pure logic: the cluster
// is seen through MemoryView, time through Clock and Timer; no gRPC, no blocking.
//
// What a worker holds, as admission sees it: max(its last reported use, the bytes of its
// committed buffers the coordinator computes from the layouts + the reservations of
// admitted operations). The report is a floor (other things use memory: buffers the
// coordinator does not know, copies of lent memory); the coordinator's own count covers what
// happened since the last heartbeat.

#include <algorithm>
#include <atomic>
#include <cstdint>
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
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "common/timer.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "sharding/layout.h"
#include "sharding/plan.h"
#include "sharding/staging.h"

namespace shardcoord {

// The staging of one fragment: at most `buckets_in_flight` buckets at once, and never more
// than `cap` whatever the bucket size (sharding/staging.h).
struct StagingNeed {
  int64_t cap = 0;
  int64_t buckets_in_flight = kBucketsInFlight;

  // Its staging with buckets of `bucket_bytes`.
  int64_t At(int64_t bucket_bytes) const { return std::min(cap, buckets_in_flight * bucket_bytes); }
};

// What an operation takes on each worker, by global rank.
struct MemoryDemand {
  // New buffers: held from the start until the operation ends (then committed or freed).
  std::map<int64_t, int64_t> buffers;
  // The staging of every fragment that runs on the rank at the same time (the members of a
  // group that run as plans of their own; one entry for a fused fragment): with buckets of b
  // bytes the rank stages the sum of their At(b).
  std::map<int64_t, std::vector<StagingNeed>> staging;
  // Committed bytes the operation frees on each rank when it commits (the version it
  // replaces): memory a waiting operation may hope for.
  std::map<int64_t, int64_t> frees;

  void Add(const MemoryDemand& other);
  std::set<int64_t> Ranks() const;
};

// The demand of one plan: a new buffer for every rank of its target layout unless
// `target_in_place` (a Copy into an attached tensor writes the lent buffers), its staging
// caps, and `replaced` (the target tensor's current layout, null when nothing is freed at
// commit) as what it frees. Without `staging` (a fused group's member: its group's fragment
// stages for it) the staging caps are left out. New buffers hold the plan's target dtype;
// `replaced` holds `replaced_dtype` (empty: the target dtype too; a plan that casts a tensor
// itself frees buffers of its old dtype).
MemoryDemand PlanMemoryDemand(const Plan& plan, bool target_in_place, const Layout* replaced,
                              bool staging = true, std::optional<DType> replaced_dtype = {});

// Bytes of every rank's local buffer of `layout` (dtype `dtype`), by rank.
std::map<int64_t, int64_t> LayoutBytesByRank(const Layout& layout, DType dtype);

// One worker as admission sees it.
struct WorkerMemoryView {
  int64_t rank = 0;
  std::string name;
  int64_t budget_bytes = 0;  // 0: no budget known (no limit).
  int64_t used_bytes = 0;    // Its last report.
  int64_t bucket_bytes = 0;  // Its --bucket-bytes; 0: unknown.
};

// The cluster, for admission.
class MemoryView {
 public:
  virtual ~MemoryView() = default;
  // Every registered worker, by rank.
  virtual std::map<int64_t, WorkerMemoryView> Workers() const = 0;
  // Bytes of the committed buffers live workers hold, by rank (from the layouts).
  virtual std::map<int64_t, int64_t> CommittedBytes() const = 0;
};

// MemoryView of the coordinator's managers. Also a WorkerListener: a worker's memory report
// re-checks waiting operations (set_controller).
class AdmissionController;
class ClusterMemoryView final : public MemoryView, public WorkerListener {
 public:
  ClusterMemoryView(WorkerManager* workers, TensorManager* tensors)
      : workers_(workers), tensors_(tensors) {}
  void set_controller(AdmissionController* controller) { controller_ = controller; }

  std::map<int64_t, WorkerMemoryView> Workers() const override;
  std::map<int64_t, int64_t> CommittedBytes() const override;
  void OnWorkerLost(const WorkerRecord&, const std::string&) override {}
  void OnWorkerMemory(const WorkerRecord& worker) override;

 private:
  WorkerManager* const workers_;
  TensorManager* const tensors_;
  AdmissionController* controller_ = nullptr;
};

struct AdmissionMetrics {
  // Time from a request to its admission or refusal, by result ("admitted": at once,
  // "waited", "refused": at once, "timed_out"); also counts them.
  HistogramFamily* wait_seconds = nullptr;
};

struct AdmissionOptions {
  // How long a plan waits for memory (zero: refused at once when it does not fit).
  absl::Duration timeout = absl::Seconds(30);
  // The smallest bucket admission lowers a plan's buckets to, and the bucket when no worker
  // reports one.
  int64_t min_bucket_bytes = kMinBucketBytes;
  int64_t default_bucket_bytes = kDefaultBucketBytes;
  AdmissionMetrics metrics;
};

// Admits operations against the workers' budgets, first come first served per worker: an
// operation waits while an earlier one that needs one of its workers waits. Thread-safe;
// callbacks run without the controller's lock, on the thread that released memory (Release,
// Recheck) or the timer's.
class AdmissionController {
 public:
  AdmissionController(const Clock* clock, Timer* timer, MemoryView* view,
                      AdmissionOptions options = {});
  ~AdmissionController();

  using AdmitFn = std::function<void(int64_t bucket_bytes)>;
  using RefuseFn = std::function<void(const absl::Status&)>;
  struct Grant {
    int64_t ticket = 0;
    // Admitted now, with buckets of bucket_bytes; else it waits (why: `waiting`) and exactly
    // one of the callbacks follows, unless it is Released first.
    bool admitted = false;
    int64_t bucket_bytes = 0;
    std::string waiting;
  };

  // `what` names the operation in messages ("plan p-3", "group g-2", "creating 'w'"). The
  // bucket chosen is the smallest of the workers' --bucket-bytes, lowered (not below
  // min_bucket_bytes) until the staging fits after the new buffers on every worker.
  // RESOURCE_EXHAUSTED naming the worker, the bytes needed and the bytes free when the
  // buffers with the smallest buckets cannot fit even once every admitted operation has
  // ended, or when they do not fit now and `may_wait` is false or the timeout is zero.
  // Operations that may not wait are checked against the coordinator's own count (committed
  // + reserved), not the workers' reports, which lag behind deletes by a heartbeat.
  absl::StatusOr<Grant> Request(const std::string& what, MemoryDemand demand, bool may_wait,
                                AdmitFn admitted, RefuseFn refused);
  // The operation ended or gave up: its reservation (or its place in line) is gone and
  // waiting operations are re-checked. No callback of it runs after this returns, except one
  // already running. Unknown tickets (0 included) are ignored.
  void Release(int64_t ticket);
  // Something changed outside (a worker's report, a tensor deleted): re-checks waiting
  // operations.
  void Recheck();

  size_t waiting() const;
  // Bytes admitted operations have reserved on `rank` (buffers and staging).
  int64_t reserved_bytes(int64_t rank) const;

 private:
  struct Ticket {
    std::string what;
    MemoryDemand demand;
    bool admitted = false;
    int64_t bucket_bytes = 0;
    absl::Time since;
    Timer::Id timer = 0;
    std::string waiting;  // Why it does not fit yet.
    AdmitFn admitted_fn;
    RefuseFn refused_fn;
  };
  struct Fit {
    bool fits = false;
    int64_t bucket_bytes = 0;
    std::string why;  // When it does not fit: the worker, bytes needed and free.
  };
  struct Snapshot {
    std::map<int64_t, WorkerMemoryView> workers;
    std::map<int64_t, int64_t> committed;
    std::map<int64_t, int64_t> reserved;  // Admitted tickets' buffers + staging.
    std::map<int64_t, int64_t> freeing;   // Admitted tickets' frees.
  };

  Snapshot TakeSnapshotLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Against what workers hold now (optimistic: against their committed buffers only, less
  // what admitted operations free, as if every admitted operation had ended). `floor`: count
  // the workers' reported use as a floor (plans; creates and uploads, which cannot wait for
  // the next report after a delete, count the coordinator's own numbers only: a worker
  // still refuses what does not fit its budget).
  Fit Evaluate(const MemoryDemand& demand, const Snapshot& snapshot, bool optimistic,
               bool floor = true) const;
  static std::map<int64_t, int64_t> Reservation(const Ticket& t);
  // Admits what fits, in order; returns the callbacks to run.
  std::vector<std::function<void()>> PassLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Observe(const char* result, absl::Time since) const;
  void TimedOut(int64_t ticket);

  const Clock* const clock_;
  Timer* const timer_;
  MemoryView* const view_;
  const AdmissionOptions options_;

  mutable absl::Mutex mu_;
  std::map<int64_t, Ticket> tickets_ ABSL_GUARDED_BY(mu_);  // By id: arrival order.
  int64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  size_t waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// The admitted memory of an operation that does not wait (a create, an upload): released
// once, by Release or when the last holder lets go. Thread-safe.
class AdmissionHold {
 public:
  AdmissionHold(AdmissionController* controller, int64_t ticket)
      : controller_(controller), ticket_(ticket) {}
  ~AdmissionHold() { Release(); }
  AdmissionHold(const AdmissionHold&) = delete;
  AdmissionHold& operator=(const AdmissionHold&) = delete;

  void Release() {
    if (!released_.exchange(true)) controller_->Release(ticket_);
  }

 private:
  AdmissionController* const controller_;
  const int64_t ticket_;
  std::atomic<bool> released_{false};
};

// Admits `buffers` (bytes by rank) at once for `what`, or RESOURCE_EXHAUSTED as Request
// (never waits). Null `controller`: nothing to hold.
absl::StatusOr<std::shared_ptr<AdmissionHold>> AdmitNow(AdmissionController* controller,
                                                        const std::string& what,
                                                        std::map<int64_t, int64_t> buffers);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_PLANS_ADMISSION_H_
