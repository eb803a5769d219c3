#ifndef SHARDCOORD_COORDINATOR_CLUSTER_WORKER_MANAGER_H_
#define SHARDCOORD_COORDINATOR_CLUSTER_WORKER_MANAGER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/cluster/worker_client.h"
#include "coordinator/store/state_store.h"

namespace shardcoord {

// A worker's memory as it last reported it (worker --memory-budget; issue 10).
struct WorkerMemory {
  int64_t budget_bytes = 0;  // 0: not reported (no limit known).
  int64_t used_bytes = 0;    // What it holds against the budget.
  int64_t peak_bytes = 0;    // The most it has held.
};

// What a worker says about itself when it registers.
struct WorkerSpec {
  std::string name;  // Stable identity; the global rank follows the name.
  std::string host;
  std::string device;   // "cpu" or "cuda:N".
  std::string address;  // host:port of its Worker service.
  std::string backend;  // "gloo" or "nccl".
  // Its Unix socket for user processes that attach buffers; empty: none.
  std::string local_socket;
  // Its memory, updated by every heartbeat that reports it.
  WorkerMemory memory;
  int64_t bucket_bytes = 0;  // Its --bucket-bytes; 0: not reported.
};

// A snapshot of one worker.
struct WorkerRecord {
  WorkerSpec spec;
  int64_t rank = 0;
  int64_t incarnation = 0;
  bool alive = false;
  absl::Time last_heartbeat = absl::InfinitePast();
  std::string death_reason;  // Why it is dead, when it is.
  // Dead only because the coordinator restarted: expected to register again until the
  // recovery timeout.
  bool awaited = false;
  // The worker said it is leaving (SetLeaving): no new plan may use it.
  bool leaving = false;

  // "worker w1 (rank 1)": how errors name a worker.
  std::string Describe() const;
  // The error of an operation that needs this dead worker, "<Describe()> <what> (<reason>)":
  // UNAVAILABLE while it is awaited (retry), FAILED_PRECONDITION otherwise.
  absl::Status DeadError(absl::string_view what) const;
  // Where calls to this incarnation go.
  WorkerEndpoint Endpoint() const {
    return WorkerEndpoint{spec.name, rank, spec.address, incarnation};
  }
};

// Lookups in a list of workers indexed by rank (WorkerManager's own, or a List() copy a
// caller reads many times): the worker of `rank`, NOT_FOUND "no worker has rank N" otherwise;
// whether it is alive in exactly `incarnation`; every rank's host (empty where unknown).
absl::StatusOr<const WorkerRecord*> WorkerOfRank(const std::vector<WorkerRecord>& workers,
                                                 int64_t rank);
bool IsLiveIn(const std::vector<WorkerRecord>& workers, int64_t rank, int64_t incarnation);
std::vector<std::string> HostsOf(const std::vector<WorkerRecord>& workers);

// Learns that a worker incarnation is gone: declared dead, or replaced by a new registration
// under the same name. Called without any manager lock held, on the thread that noticed.
class WorkerListener {
 public:
  virtual ~WorkerListener() = default;
  // `worker` is the incarnation that is gone; `reason` says why ("no heartbeat for 5s").
  virtual void OnWorkerLost(const WorkerRecord& worker, const std::string& reason) = 0;
  // A registration or heartbeat reported the worker's memory (spec.memory, now current).
  virtual void OnWorkerMemory(const WorkerRecord& worker) {}
};

// Registered workers and their health, as TSL's coordination service tracks tasks: a name
// gets a global rank on first registration (first come, first ranked) and keeps it; every
// registration gets a new incarnation, increasing over the coordinator's life, and calls
// from older incarnations are rejected. A worker without a heartbeat for `heartbeat_timeout`
// is dead; the daemon's health thread calls CheckHealth. Thread-safe.
class WorkerManager {
 public:
  // `store` (not owned; null: nothing is stored) keeps the name -> rank table and each
  // worker's last incarnation and liveness ("worker" records, WorkerInfo): ranks stay stable
  // and incarnations keep increasing across coordinator restarts.
  WorkerManager(const Clock* clock, absl::Duration heartbeat_timeout, StateStore* store = nullptr);

  // Loads the stored workers, all dead ("coordinator restarted") until they register again,
  // and remembers which incarnations were live when the coordinator stopped. Call once,
  // before workers register. INTERNAL for a record that does not parse.
  absl::Status Load();
  // True when `rank` was live in `incarnation` when the coordinator last stopped (per Load).
  bool WasLiveBeforeRestart(int64_t rank, int64_t incarnation) const;
  // The recovery timeout passed: workers that did not register again are plainly dead.
  void EndAwaiting();

  // Not owned; must outlive the manager. Add before workers register.
  void AddListener(WorkerListener* listener);

  // INVALID_ARGUMENT empty name or address; UNAVAILABLE (or the store's error) when the
  // registration could not be stored (nothing changed). A live worker that registers again loses
  // its old incarnation (listeners hear of it).
  absl::StatusOr<WorkerRecord> Register(const WorkerSpec& spec);

  // NOT_FOUND unknown name; ABORTED a stale incarnation or a worker declared dead (it must
  // register again). `memory`, when given, replaces spec.memory (listeners hear of it).
  absl::Status Heartbeat(absl::string_view name, int64_t incarnation,
                         const WorkerMemory* memory = nullptr);

  // As Heartbeat's checks, without refreshing: is this call from the current, live
  // incarnation?
  absl::Status CheckCurrent(absl::string_view name, int64_t incarnation) const;

  // Declares dead every live worker whose last heartbeat is older than the timeout at `now`
  // and tells the listeners. Returns the newly dead.
  std::vector<WorkerRecord> CheckHealth(absl::Time now);

  // A draining worker announced it is leaving: marks it so that no new plan uses it (until
  // it is dead or registers again). As CheckCurrent's errors; FAILED_PRECONDITION when it is
  // already leaving.
  absl::StatusOr<WorkerRecord> SetLeaving(absl::string_view name, int64_t incarnation);

  // Declares a worker dead now (e.g. it could not be reached); NOT_FOUND unknown name.
  absl::Status MarkDead(absl::string_view name, int64_t incarnation, const std::string& reason);

  // In rank order.
  std::vector<WorkerRecord> List() const;
  absl::StatusOr<WorkerRecord> Get(absl::string_view name) const;
  absl::StatusOr<WorkerRecord> GetByRank(int64_t rank) const;
  // True when `rank` is alive in exactly this incarnation.
  bool IsLive(int64_t rank, int64_t incarnation) const;
  // hosts[r] = host of rank r (empty where unknown), for the planner's sender preference.
  std::vector<std::string> HostsByRank() const;

  absl::Duration heartbeat_timeout() const { return heartbeat_timeout_; }

 private:
  void Notify(const std::vector<std::pair<WorkerRecord, std::string>>& lost);
  void NotifyMemory(const WorkerRecord& worker);
  // Stores `w` (no-op without a store).
  absl::Status Persist(const WorkerRecord& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;
  const absl::Duration heartbeat_timeout_;
  StateStore* const store_;
  mutable absl::Mutex mu_;
  std::vector<WorkerListener*> listeners_ ABSL_GUARDED_BY(mu_);
  std::vector<WorkerRecord> workers_ ABSL_GUARDED_BY(mu_);  // Index = rank.
  absl::flat_hash_map<std::string, int64_t> rank_of_ ABSL_GUARDED_BY(mu_);
  int64_t last_incarnation_ ABSL_GUARDED_BY(mu_) = 0;
  // rank -> incarnation live when the coordinator last stopped (from Load).
  absl::flat_hash_map<int64_t, int64_t> live_before_restart_ ABSL_GUARDED_BY(mu_);
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_CLUSTER_WORKER_MANAGER_H_
