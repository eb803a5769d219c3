#ifndef SHARDCOORD_COORDINATOR_PLANS_HIDDEN_TENSOR_H_
#define SHARDCOORD_COORDINATOR_PLANS_HIDDEN_TENSOR_H_

// Hidden tensors of multi-step operations (block copies, slice copies): tensors a step writes
// and a later step reads, owned by the operation (TensorRecord::owner), never listed, dropped
// at its end.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"

namespace shardcoord {

// The endpoint of the worker holding `rank`: NOT_FOUND, or its DeadError when it is dead.
absl::StatusOr<WorkerEndpoint> LiveEndpoint(const WorkerManager& workers, int64_t rank);

// Registers `name`, hidden by `owner`, at `layout` and `version` on the live workers of its
// ranks: ready without buffers (`checksums` empty: its first version is never read, a step
// writes the next) or over buffers the workers just made (their checksums). `name` is
// appended to `reserved` once reserved, so that the caller drops it whatever follows.
absl::Status AddHiddenTensor(TensorManager* tensors, const WorkerManager& workers,
                             const std::string& owner, const std::string& name, DType dtype,
                             const Layout& layout, int64_t version, const std::string& spec,
                             LayoutChecksums checksums, std::vector<std::string>* reserved);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_PLANS_HIDDEN_TENSOR_H_
