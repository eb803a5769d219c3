#include "sharding/plan_participants.h"

#include <algorithm>

namespace shardcoord {

std::vector<int64_t> PlanParticipants(const Plan& plan) {
  // A sorted vector, not a std::set: a handful of ranks, asked for every plan started and sent.
  std::vector<int64_t> ranks;
  ranks.reserve(plan.source.ranks().size() + plan.target.ranks().size());
  for (const RankChunks& rc : plan.source.ranks()) ranks.push_back(rc.rank);
  for (const RankChunks& rc : plan.target.ranks()) ranks.push_back(rc.rank);
  for (const Step& s : plan.steps) ranks.insert(ranks.end(), s.ranks.begin(), s.ranks.end());
  for (const LocalCopy& c : plan.local_copies) ranks.push_back(c.rank);
  ranks.insert(ranks.end(), plan.zero_fill_ranks.begin(), plan.zero_fill_ranks.end());
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  return ranks;
}

}  // namespace shardcoord
