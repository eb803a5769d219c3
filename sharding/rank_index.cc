#include "sharding/rank_index.h"

#include <algorithm>

namespace shardcoord {

RankIndex::RankIndex(const Layout& a, const Layout& b) {
  int64_t max_rank = 0;
  const size_t count = a.ranks().size() + b.ranks().size();
  for (const Layout* l : {&a, &b}) {
    for (const RankChunks& rc : l->ranks()) max_rank = std::max(max_rank, rc.rank);
  }
  if (max_rank <= 4 * static_cast<int64_t>(count) + 1024) {
    table_.assign(max_rank + 1, -1);
    for (const Layout* l : {&a, &b}) {
      for (const RankChunks& rc : l->ranks()) table_[rc.rank] = 0;
    }
    for (int64_t r = 0; r <= max_rank; ++r) {
      if (table_[r] < 0) continue;
      table_[r] = static_cast<int>(ranks_.size());
      ranks_.push_back(r);
    }
    return;
  }
  for (const Layout* l : {&a, &b}) {
    for (const RankChunks& rc : l->ranks()) ranks_.push_back(rc.rank);
  }
  std::sort(ranks_.begin(), ranks_.end());
  ranks_.erase(std::unique(ranks_.begin(), ranks_.end()), ranks_.end());
  for (size_t i = 0; i < ranks_.size(); ++i) map_[ranks_[i]] = static_cast<int>(i);
}

}  // namespace shardcoord
