#ifndef SHARDCOORD_SHARDING_RANK_INDEX_H_
#define SHARDCOORD_SHARDING_RANK_INDEX_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "sharding/layout.h"

namespace shardcoord {

// Dense ids 0..n-1 for the global ranks of both layouts, in ascending rank order. Rank
// numbers are usually dense, so a table replaces sorting and hashing.
class RankIndex {
 public:
  RankIndex(const Layout& a, const Layout& b);

  // `rank` must be a rank of one of the layouts.
  int Id(int64_t rank) const { return map_.empty() ? table_[rank] : map_.at(rank); }
  int64_t Rank(int id) const { return ranks_[id]; }
  int size() const { return static_cast<int>(ranks_.size()); }

 private:
  std::vector<int64_t> ranks_;
  std::vector<int> table_;
  absl::flat_hash_map<int64_t, int> map_;
};

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_RANK_INDEX_H_
