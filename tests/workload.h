#ifndef SHARDCOORD_TESTS_WORKLOAD_H_
#define SHARDCOORD_TESTS_WORKLOAD_H_

// The workload of the coordinator fault tests (chaos_test, ha_test): concurrent clients,
// each creating, redistributing, copying, uploading and deleting tensors of its own on the
// meshes "grid" (2x2) and "line" (4), recording what every acknowledged operation left. The
// clients retry UNAVAILABLE with one request_id per change (CoordinatorClient), so a change
// retried across a restart or a change of leader takes effect once. Afterwards
// ExpectAcknowledgedState checks the cluster against the record. Random choices come from
// fixed seeds; progress is counted so that a test injects its faults at random points of the
// workload by waiting on a condition, not on time.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/coordinator_client.h"
#include "sharding/fill.h"

namespace shardcoord {

// Counts finished operations; fault injectors wait on it.
class Progress {
 public:
  void Done();
  // A client stopped on an unexpected error: nobody waits for progress any more.
  void Failed();
  // Waits until `n` more operations finished than at `since` (or a client failed); returns
  // the count, or -1 after a failure.
  int64_t WaitPast(int64_t since, int64_t n);
  int64_t ops();

 private:
  absl::Mutex mu_;
  int64_t ops_ ABSL_GUARDED_BY(mu_) = 0;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
};

// What a tensor holds: FillValue(kind, seed, i) at element i.
struct Content {
  FillKind kind = FillKind::kArange;
  uint64_t seed = 0;
};

// One client's tensors ("c<i>_<n>") and what each must hold once its operations were
// acknowledged. Only this client's thread touches them.
class Workload {
 public:
  // `address`: the coordinator(s), "A" or "A,B".
  Workload(int index, const std::string& address, uint64_t seed, absl::Duration retry_for,
           Progress* progress);

  // Runs operations until `stop` returns true. Records the first unexpected error.
  void Run(const std::function<bool()>& stop);

  const absl::Status& error() const { return error_; }
  const std::map<std::string, Content>& live() const { return live_; }
  const std::vector<std::string>& deleted() const { return deleted_; }
  int64_t acknowledged() const { return acknowledged_; }
  int64_t refused() const { return refused_; }

 private:
  struct Placement {
    const char* mesh;
    const char* spec;
  };
  std::string Pick();
  const Placement& RandomPlacement();
  void Fail(const std::string& what, const absl::Status& s);
  void Step();
  void Create();
  void Redistribute();
  void Copy();
  void Upload();
  void Delete();

  const int index_;
  const absl::Duration retry_for_;
  std::mt19937_64 rng_;
  Progress* const progress_;
  std::unique_ptr<CoordinatorClient> client_;
  int next_ = 0;
  std::map<std::string, Content> live_;
  std::vector<std::string> deleted_;
  int64_t acknowledged_ = 0;
  int64_t refused_ = 0;
  absl::Status error_;
};

// `clients` Workloads on threads of their own, from Start until Stop.
class WorkloadRunner {
 public:
  WorkloadRunner(int clients, const std::string& address, uint64_t seed, absl::Duration retry_for);
  ~WorkloadRunner();
  Progress& progress() { return progress_; }
  // Ends every client after its current operation and joins them.
  void Stop();
  const std::vector<std::unique_ptr<Workload>>& workloads() const { return workloads_; }

 private:
  Progress progress_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<Workload>> workloads_;
  std::vector<std::thread> threads_;
};

// The meshes the workload uses: "grid" 2x2 over w0..w3, "line" 4 over w3..w0.
absl::Status MakeWorkloadMeshes(CoordinatorClient& client);

struct WorkloadTotals {
  int64_t acknowledged = 0;  // Operations acknowledged.
  int64_t refused = 0;       // Plans aborted by a fault (ABORTED: the old version stays).
  int64_t checked = 0;       // Tensors checked value by value.
};

// gtest expectations: no client failed; every tensor a client holds downloads with its
// values, has no lost chunks and no plan; every tensor it deleted is gone; and no other
// tensor exists (nothing acted twice into a tensor the record does not know).
WorkloadTotals ExpectAcknowledgedState(CoordinatorClient& client, const WorkloadRunner& runner);

}  // namespace shardcoord

#endif  // SHARDCOORD_TESTS_WORKLOAD_H_
