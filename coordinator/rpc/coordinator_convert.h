#ifndef SHARDCOORD_COORDINATOR_RPC_COORDINATOR_CONVERT_H_
#define SHARDCOORD_COORDINATOR_RPC_COORDINATOR_CONVERT_H_

#include "coordinator/cluster/mesh_manager.h"
#include "coordinator/cluster/worker_manager.h"
#include "coordinator/plans/plan_manager.h"
#include "coordinator/state/tensor_manager.h"
#include "proto/shardcoord.pb.h"

namespace shardcoord {

// Record -> wire conversions of coordinator state (the sharding/ parts go through
// proto/convert).
v1::WorkerInfo WorkerInfoToProto(const WorkerRecord& w);
v1::MeshInfo MeshInfoToProto(const MeshRecord& m);
v1::TensorInfo TensorInfoToProto(const TensorRecord& t, const LivenessFn& live);
v1::PlanProgress PlanProgressToProto(const PlanProgress& p);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_RPC_COORDINATOR_CONVERT_H_
