#include "sharding/plan_participants.h"

#include <set>

namespace shardcoord {

std::vector<int64_t> PlanParticipants(const Plan& plan) {
  std::set<int64_t> ranks;
  for (const RankChunks& rc : plan.source.ranks()) ranks.insert(rc.rank);
  for (const RankChunks& rc : plan.target.ranks()) ranks.insert(rc.rank);
  for (const Step& s : plan.steps) ranks.insert(s.ranks.begin(), s.ranks.end());
  for (const LocalCopy& c : plan.local_copies) ranks.insert(c.rank);
  ranks.insert(plan.zero_fill_ranks.begin(), plan.zero_fill_ranks.end());
  return std::vector<int64_t>(ranks.begin(), ranks.end());
}

}  // namespace shardcoord
