#ifndef SHARDCOORD_SHARDING_REFERENCE_EXECUTOR_H_
#define SHARDCOORD_SHARDING_REFERENCE_EXECUTOR_H_

// A slow, obviously correct executor of plans, for checking the planner: it simulates every
// rank's source and target memory element by element (values are int64 stand-ins for
// elements), applies a plan as sharding/plan.h specifies, and checks that every target
// element ends with the value the source layout holds, each needed contribution delivered
// exactly once. The same semantics as planner_property_test's simulation, returning statuses
// instead of test assertions, so fuzz targets can use it too.

#include <cstdint>

#include "absl/status/status.h"
#include "sharding/plan.h"

namespace shardcoord {

// Runs `plan` with source values derived from `seed` and checks the target memory. With
// `collectives`, reducing collective steps run as the collective (their marked local copies
// skipped, every member's contribution combined over the boxes each receiver gets); without,
// every transfer runs as listed. INTERNAL naming the rank, box or element on a mismatch.
absl::Status CheckPlanByExecution(const Plan& plan, uint64_t seed, bool collectives);

// Structural invariants independent of values: groups without repeated ranks, no empty or
// self transfers, transfers inside their step's group, bytes matching boxes, step and plan
// byte totals, per-rank traffic, broadcast roots, local copies tied to reducing collectives.
absl::Status CheckPlanStructure(const Plan& plan);

// The bytes each destination needs and does not already hold, counted element by element
// (what plan.lower_bound_bytes must be).
int64_t BruteForceLowerBound(const Plan& plan);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_REFERENCE_EXECUTOR_H_
