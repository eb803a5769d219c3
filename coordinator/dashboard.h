#ifndef SHARDCOORD_COORDINATOR_DASHBOARD_H_
#define SHARDCOORD_COORDINATOR_DASHBOARD_H_

// The coordinator's read-only dashboard: a page (GET /) that polls GET /api/state.

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/mesh_manager.h"
#include "coordinator/tensor_manager.h"
#include "coordinator/worker_manager.h"

namespace shardcoord {

// {"workers": [...], "meshes": [...], "tensors": [...]}: each element the shardcoord.v1
// WorkerInfo, MeshInfo or TensorInfo in proto3's JSON mapping with proto field names (int64
// as strings, enums by name), as ListWorkers, ListMeshes and ListTensors answer; tensors
// without their layout (per-chunk data that grows with the ranks).
absl::StatusOr<std::string> StateJson(const WorkerManager& workers, const MeshManager& meshes,
                                      const TensorManager& tensors);

// The page: static HTML and JavaScript, no external resources.
const std::string& DashboardHtml();

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_DASHBOARD_H_
