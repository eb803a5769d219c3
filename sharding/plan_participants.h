#ifndef SHARDCOORD_SHARDING_PLAN_PARTICIPANTS_H_
#define SHARDCOORD_SHARDING_PLAN_PARTICIPANTS_H_

#include <cstdint>
#include <vector>

#include "sharding/plan.h"

namespace shardcoord {

// Every rank that takes part in a plan, sorted: holders of source or target chunks, members
// of any step, ranks with local copies or zero fills.
std::vector<int64_t> PlanParticipants(const Plan& plan);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_PLAN_PARTICIPANTS_H_
