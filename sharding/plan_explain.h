#ifndef SHARDCOORD_SHARDING_PLAN_EXPLAIN_H_
#define SHARDCOORD_SHARDING_PLAN_EXPLAIN_H_

#include <string>

#include "sharding/plan.h"

namespace shardcoord {

// Human description: layouts, bytes, steps (op, group, bytes, estimate), local copies, and
// per-rank bytes sent and received.
std::string ExplainPlan(const Plan& plan);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_PLAN_EXPLAIN_H_
