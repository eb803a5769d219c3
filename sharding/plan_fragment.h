#ifndef SHARDCOORD_SHARDING_PLAN_FRAGMENT_H_
#define SHARDCOORD_SHARDING_PLAN_FRAGMENT_H_

// What one rank does in a plan or a fused group of plans, as sharding types: what a worker
// executes. proto/convert.h converts v1::PlanFragment to these.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/plan.h"

namespace shardcoord {

// A fragment as sharding types, for workers.
struct Fragment {
  std::string plan_id;
  std::string tensor;         // Read at source_version.
  std::string target_tensor;  // Written at target_version: `tensor` unless a Copy.
  DType dtype = DType::kF32;
  int64_t rank = 0;
  int64_t source_version = 0;
  int64_t target_version = 0;
  RankChunks source;  // chunks empty when the rank holds no source.
  RankChunks target;
  std::vector<LocalCopy> local_copies;
  std::vector<Step> steps;
  std::vector<int> step_indices;  // Plan-wide index of steps[i].
  bool zero_fill = false;
  int64_t divide_by = 1;
  ReduceOp reduce_op = ReduceOp::kSum;
  int64_t num_partials = 1;
  absl::flat_hash_map<int64_t, int64_t> member_incarnations;
  int64_t step_timeout_ms = 0;
  std::string communicator_prefix;
  int64_t attached_target_version = 0;  // > 0: write that attached buffer in place.
  int64_t bucket_bytes = 0;             // The plan's bucket size; 0: the worker's default.
  // A member of a fused group: the transfers this rank sends or receives, in plan order
  // (`steps` is empty; the group's exchange moves them).
  std::vector<Transfer> transfers;
};

// A member of a fused group's fragment, for workers.
struct GroupMember {
  int32_t index = 0;  // FragmentMember.index.
  std::string plan_id;
  std::string tensor;         // Read at source_version.
  std::string target_tensor;  // Written at target_version.
  int64_t source_version = 0;
  int64_t target_version = 0;
  int64_t attached_target_version = 0;
  int shape = 0;  // Index into GroupFragment::shapes.
};

// A fused group's fragment (PlanFragment with `members`), for workers.
struct GroupFragment {
  std::string plan_id;  // The group's id.
  int64_t rank = 0;
  // What this rank does in each distinct plan: a Fragment without tensor names, versions or
  // steps (its `transfers` hold the rank's), with the group's plan id, rank, step timeout and
  // communicator prefix (member_incarnations empty).
  std::vector<Fragment> shapes;
  std::vector<GroupMember> members;  // In the group's order.
  std::vector<int64_t> exchange_ranks;
  absl::flat_hash_map<int64_t, int64_t> member_incarnations;  // Of exchange_ranks.
  int64_t bucket_bytes = 0;
  int64_t step_timeout_ms = 0;
  std::string communicator_prefix;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_PLAN_FRAGMENT_H_
