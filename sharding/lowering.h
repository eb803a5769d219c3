#ifndef SHARDCOORD_SHARDING_LOWERING_H_
#define SHARDCOORD_SHARDING_LOWERING_H_

#include <cstdint>
#include <vector>

#include "sharding/cost_model.h"
#include "sharding/plan.h"
#include "sharding/rank_index.h"

namespace shardcoord {

// What lowering reads besides the plan. Everything is borrowed and must outlive the call.
struct LoweringInput {
  const RankIndex& ranks;
  const std::vector<int64_t>& host;  // Host by rank id (HostMap::HostOf).
  const CostModel& cost;
  bool use_collectives;  // False: everything goes into the point-to-point step.
  int64_t num_partials;  // Of the source: a reduction needs one contribution per member.
};

// Turns the transfers (senders assigned) into plan->steps. Splits them into connected
// groups of ranks (union-find), bucketed by the group's smallest rank, and turns each group
// into a collective step where its pattern is exactly one and the cost model does not
// prefer point-to-point; the rest forms one point-to-point step, last. Marks the local
// copies a reducing collective consumes (LocalCopy::collective_step). Reads
// plan->local_copies (sorted by rank, partial index, box) and plan->reduce_op; sets only
// the steps' ops, groups, transfers and estimates (not their bytes). Deterministic.
void LowerToSteps(const LoweringInput& in, std::vector<Transfer> transfers, Plan* plan);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_LOWERING_H_
