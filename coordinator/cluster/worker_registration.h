#ifndef SHARDCOORD_COORDINATOR_CLUSTER_WORKER_REGISTRATION_H_
#define SHARDCOORD_COORDINATOR_CLUSTER_WORKER_REGISTRATION_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/state/tensor_manager.h"

namespace shardcoord {

// A worker joining (CoordinatorWorkers.RegisterWorker), as one protocol: it gets its rank and
// a new incarnation (WorkerManager::Register), then the buffers it reports are reconciled
// with the tensors (TensorManager::Reconcile: after a restart, or a worker that was cut off).
// When the reconcile fails (the store could not record it) the new incarnation is rolled
// back: declared dead at once, so that nothing uses an incarnation the worker never learned,
// and the worker's retry registers afresh. gRPC-free; thread-safe (the managers are).
class WorkerRegistration {
 public:
  WorkerRegistration(WorkerManager* workers, TensorManager* tensors)
      : workers_(workers), tensors_(tensors) {}

  struct Registered {
    WorkerRecord worker;
    // Buffers the worker must drop (tensor, version): see TensorManager::Reconcile.
    std::vector<std::pair<std::string, int64_t>> drop;
  };
  // WorkerManager::Register's errors (nothing changed); the reconcile's (the store's
  // UNAVAILABLE), after the rollback.
  absl::StatusOr<Registered> Register(const WorkerSpec& spec, const std::vector<HeldBuffer>& held);

 private:
  WorkerManager* const workers_;
  TensorManager* const tensors_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_CLUSTER_WORKER_REGISTRATION_H_
