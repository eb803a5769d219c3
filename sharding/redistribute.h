#ifndef SHARDCOORD_SHARDING_REDISTRIBUTE_H_
#define SHARDCOORD_SHARDING_REDISTRIBUTE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "sharding/cast.h"
#include "sharding/cost_model.h"
#include "sharding/dtype.h"
#include "sharding/layout.h"
#include "sharding/plan.h"

// The planner proper: composes the spatial index (spatial_index.h), sender assignment
// (sender_assignment.h) and lowering to collectives (lowering.h). Include planner.h, which
// also brings ExplainPlan and PlanCache.

namespace shardcoord {

struct PlanOptions {
  // hosts_by_rank[r] is the host of global rank r (empty or missing: unknown). When empty and
  // ranks_per_host > 0, ranks [k*n, (k+1)*n) share host k. Hosts steer sender choice (same
  // host preferred) and the link class in estimates.
  std::vector<std::string> hosts_by_rank;
  int64_t ranks_per_host = 0;
  CostModel cost;
  // False: every transfer goes into one point-to-point step (for executors without
  // collectives, and to compare lowerings).
  bool use_collectives = true;
};

HostMap HostMapFor(const PlanOptions& options);
// Exact, for plan cache keys.
std::string OptionsFingerprint(const PlanOptions& options);

// Plans moving a tensor from `source` to `target` (see plan.h for how a plan executes).
// The layouts may use different meshes and rank sets (overlapping, disjoint, permuted) and
// any mix of Shard, uneven Shard, Replicate, Partial and flat specs; their global shapes must
// match. Every element a destination needs and does not hold arrives exactly once from a
// rank that holds it, so for non-Partial sources bytes_moved == lower_bound_bytes. Senders
// among replicas are chosen to balance bytes sent (preferring the destination's host, then
// ranks close to it in the meshes). Transfer patterns that are exactly an all-gather,
// reduce-scatter, all-reduce, all-to-all or broadcast within a group of ranks become that
// collective when the cost model does not rate point-to-point cheaper; the rest forms one
// point-to-point step. A Partial source is reduced; a Partial target other than the source
// gets the full value in contribution 0 and zeros elsewhere (sum) or the value in every
// contribution (avg, min, max). Deterministic: equal inputs give equal plans.
absl::StatusOr<Plan> Redistribute(const Layout& source, const Layout& target, DType dtype,
                                  const PlanOptions& options = {});
// The same, moving the layouts into Plan::source and Plan::target instead of copying them
// (at thousands of ranks the copies cost about as much as the planning).
absl::StatusOr<Plan> Redistribute(Layout&& source, Layout&& target, DType dtype,
                                  const PlanOptions& options = {});

// The same, converting every element from `dtype` to `target_dtype` (a Copy between dtypes;
// the rules of sharding/cast.h): Plan::cast_to is target_dtype (unless equal to dtype: then
// this is the plan above). The planner plans in the wire dtype (the narrower of the two), so
// transfer bytes, bytes_moved and lower_bound_bytes count what travels. INVALID_ARGUMENT
// naming both dtypes for a cast that is not allowed (CheckCast), or for a Partial source
// (its value is a reduction, which is computed in its own dtype: redistribute it first).
absl::StatusOr<Plan> Redistribute(const Layout& source, const Layout& target, DType dtype,
                                  DType target_dtype, const PlanOptions& options);

// Every destination rank ends with the whole tensor (one rank: gather to it). The target is
// Replicate on a 1-d mesh of `destination_ranks` in the given order.
absl::StatusOr<Plan> Gather(const Layout& source, absl::Span<const int64_t> destination_ranks,
                            DType dtype, const PlanOptions& options = {});

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_REDISTRIBUTE_H_
