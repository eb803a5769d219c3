#ifndef SHARDCOORD_SHARDING_PLANNER_H_
#define SHARDCOORD_SHARDING_PLANNER_H_

// The planner's public API in one include: Redistribute, Gather and PlanOptions
// (redistribute.h), ExplainPlan (plan_explain.h) and PlanCache (plan_cache.h). The cache
// plans through Redistribute, so the three live in separate libraries under this header.

#include "sharding/plan_cache.h"    // IWYU pragma: export
#include "sharding/plan_explain.h"  // IWYU pragma: export
#include "sharding/redistribute.h"  // IWYU pragma: export

#endif  // SHARDCOORD_SHARDING_PLANNER_H_
