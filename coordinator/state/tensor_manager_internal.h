#ifndef SHARDCOORD_COORDINATOR_STATE_TENSOR_MANAGER_INTERNAL_H_
#define SHARDCOORD_COORDINATOR_STATE_TENSOR_MANAGER_INTERNAL_H_

// What tensor_manager.cc and tensor_manager_transfers.cc share: the stored form of a tensor.
// Not for other rooms.

#include <string>

#include "coordinator/state/tensor_manager.h"

namespace shardcoord {
namespace internal_tensor_manager {

inline constexpr char kTensorKind[] = "tensor";

// A ready tensor as its "tensor" record (StoredTensor).
std::string SerializeTensor(const TensorRecord& t);

}  // namespace internal_tensor_manager
}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_STATE_TENSOR_MANAGER_INTERNAL_H_
