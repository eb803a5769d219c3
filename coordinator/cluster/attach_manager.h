#ifndef SHARDCOORD_COORDINATOR_CLUSTER_ATTACH_MANAGER_H_
#define SHARDCOORD_COORDINATOR_CLUSTER_ATTACH_MANAGER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"

namespace shardcoord {

// A buffer a user process lent a worker for one rank of an ATTACHED tensor
// (CoordinatorWorkers.AttachBuffer).
struct AttachArgs {
  std::string worker;
  int64_t incarnation = 0;
  std::string tensor;
  int64_t version = 0;
  int64_t rank = 0;
  DType dtype = DType::kF32;
  RankChunks chunks;
  std::string memory;  // "shared", "process", "cuda_ipc".
  int64_t pid = 0;
};

// Buffers a user process lent a worker in one request (CoordinatorWorkers.AttachBuffers):
// every buffer is the worker's rank's.
struct AttachManyArgs {
  std::string worker;
  int64_t incarnation = 0;
  int64_t rank = 0;
  int64_t pid = 0;
  std::vector<TensorManager::AttachItem> buffers;
  bool validate_only = false;
};

// The coordinator's side of attached tensors: which rank's chunks live in a user process's
// memory now. A worker reports each buffer lent to it (Attach) and each one that went away
// (Detach: the process detached, exited or died); a detached rank's chunks are lost as a
// dead worker's, and the plans that read them, or write them in place, abort. gRPC-free;
// thread-safe (the managers are).
class AttachManager {
 public:
  AttachManager(WorkerManager* workers, TensorManager* tensors, PlanManager* plans)
      : workers_(workers), tensors_(tensors), plans_(plans) {}

  // Returns whether every rank of the tensor has a buffer attached now (it is readable).
  // NOT_FOUND worker or tensor; ABORTED stale incarnation, the tensor busy or at another
  // version; FAILED_PRECONDITION the worker does not hold `rank`, the tensor is not
  // attached, or the rank is attached already; INVALID_ARGUMENT dtype or chunks other than
  // the rank's.
  absl::StatusOr<bool> Attach(const AttachArgs& args);
  // Attach for every buffer, all or nothing, in one store batch (TensorManager::AttachMany;
  // `validate_only`: checked, nothing changes). Answers each buffer's version, chunks and
  // whether its tensor is readable now, in order. Attach's errors, the first member's
  // starting with "buffers[i] 'NAME': ".
  absl::StatusOr<std::vector<TensorManager::Attached>> AttachMany(const AttachManyArgs& args);
  // NOT_FOUND worker; ABORTED stale incarnation. OK (nothing changes) when the rank was not
  // attached by that incarnation.
  absl::Status Detach(const std::string& worker, int64_t incarnation, const std::string& tensor,
                      int64_t rank, const std::string& reason);

  // A worker incarnation is gone (the composition root's reaction to a death): the attached
  // tensors whose rank it served. Their lent buffers are unreadable until it registers again
  // (the user processes may still hold them: TensorManager::Reconcile counts them again),
  // and plans using them abort (PlanManager hears of the death itself). For the log.
  std::vector<std::string> OnWorkerLost(const WorkerRecord& worker) const;

 private:
  WorkerManager* const workers_;
  TensorManager* const tensors_;
  PlanManager* const plans_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_CLUSTER_ATTACH_MANAGER_H_
