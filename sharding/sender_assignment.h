#ifndef SHARDCOORD_SHARDING_SENDER_ASSIGNMENT_H_
#define SHARDCOORD_SHARDING_SENDER_ASSIGNMENT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sharding/layout.h"
#include "sharding/plan.h"
#include "sharding/rank_index.h"
#include "sharding/spatial_index.h"

namespace shardcoord {

// What sender assignment reads: the ranks, where they live, and the source boxes the
// demands come from. Everything is borrowed and must outlive the call.
struct SenderAssignmentInput {
  const Layout& source;  // For the ranks' mesh coordinates.
  const Layout& target;
  const RankIndex& ranks;
  const std::vector<int64_t>& host;  // Host by rank id (HostMap::HostOf).
  bool host_aware;                   // Whether hosts are known (HostMap::known).
  const std::vector<SourceBox>& boxes;
  const std::vector<int>& holders;  // Rank ids, ascending per source box.
  // Per demand (transfer in `t`): its source box and its destination's rank id.
  const std::vector<size_t>& demand_source;
  const std::vector<int>& demand_dst;
};

// Chooses a sender (`src`, -1 on entry) for every demand in `t`. With hosts known, a
// destination that has a holder of the source box on its own host reads only from holders on
// that host, so bytes cross hosts only where no copy is on the destination's host (the
// plan's cross_host_lower_bound_bytes); the others read from any holder. Within each such
// group of demands the bytes are spread over the candidate holders by water-filling (each
// holder's fair level given what it already sends); a piece goes whole to a holder that stays
// within a small slack of the level, preferring mesh affinity, then the lighter and lower
// rank; a piece that fits nowhere is split into slabs across the candidates (the first
// replaces the demand, the others are appended to `t`). Deterministic.
void AssignSenders(const SenderAssignmentInput& in, std::vector<Transfer>& t);

// The level L such that raising every load below L up to L absorbs `demand`.
double WaterLevel(std::vector<int64_t> loads, int64_t demand);

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_SENDER_ASSIGNMENT_H_
