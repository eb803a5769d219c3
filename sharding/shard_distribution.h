#ifndef SHARDCOORD_SHARDING_SHARD_DISTRIBUTION_H_
#define SHARDCOORD_SHARDING_SHARD_DISTRIBUTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/container/btree_set.h"
#include "absl/status/statusor.h"

namespace shardcoord {

// Megatron's distribute_shards_to_ranks: picks, for every shard, one of the ranks that hold
// it (e.g. the rank that saves a replicated checkpoint shard), balancing the total size
// assigned to each rank.
//
// Deterministic greedy. Shards are taken in this order: shards in `cross_group_shards` last;
// then lowest coverage (number of distinct ranks holding it) first, so constrained shards
// are placed while there is still room; then larger size first; then shard id ascending.
// Each goes to the holding rank with the smallest load assigned so far (ties: lowest rank).
// The result depends on neither the order nor duplicates of a shard's rank list.
//
// INVALID_ARGUMENT for num_ranks <= 0, a shard with no ranks, a rank outside
// [0, num_ranks), a shard missing from `shard_to_size` or with a negative size, and loads
// that overflow int64. Sizes of shards not in `shard_to_ranks` are ignored.
absl::StatusOr<absl::btree_map<std::string, int64_t>> DistributeShardsToRanks(
    const absl::btree_map<std::string, std::vector<int64_t>>& shard_to_ranks,
    const absl::btree_map<std::string, int64_t>& shard_to_size, int64_t num_ranks,
    const absl::btree_set<std::string>& cross_group_shards = {});

}  // namespace shardcoord

#endif  // SHARDCOORD_SHARDING_SHARD_DISTRIBUTION_H_
