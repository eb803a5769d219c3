#ifndef SHARDCOORD_COORDINATOR_PLANS_PLAN_MANAGER_INTERNAL_H_
#define SHARDCOORD_COORDINATOR_PLANS_PLAN_MANAGER_INTERNAL_H_

// Helpers shared by the source files of //coordinator/plans:plan_manager; not a public API.

#include <string>
#include <vector>

#include "sharding/layout.h"

namespace shardcoord {

// "{box@offset[pN] ...}": the chunks of a report or plan, for error messages.
std::string ChunksString(const std::vector<Chunk>& chunks);

}  // namespace shardcoord

#endif  // SHARDCOORD_COORDINATOR_PLANS_PLAN_MANAGER_INTERNAL_H_
