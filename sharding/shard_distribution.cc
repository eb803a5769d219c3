#include "sharding/shard_distribution.h"

#include <algorithm>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "sharding/box.h"

namespace shardcoord {
namespace {

struct Pending {
  const std::string* id;
  std::vector<int64_t> ranks;  // Sorted, distinct.
  int64_t size;
  bool cross_group;
};

}  // namespace

absl::StatusOr<absl::btree_map<std::string, int64_t>> DistributeShardsToRanks(
    const absl::btree_map<std::string, std::vector<int64_t>>& shard_to_ranks,
    const absl::btree_map<std::string, int64_t>& shard_to_size, int64_t num_ranks,
    const absl::btree_set<std::string>& cross_group_shards) {
  if (num_ranks <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_ranks ", num_ranks, " <= 0"));
  }
  std::vector<Pending> pending;
  pending.reserve(shard_to_ranks.size());
  for (const auto& [id, ranks] : shard_to_ranks) {
    if (ranks.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("shard '", id, "' has no ranks"));
    }
    for (int64_t r : ranks) {
      if (r < 0 || r >= num_ranks) {
        return absl::InvalidArgumentError(
            absl::StrCat("shard '", id, "' lists rank ", r, " outside [0, ", num_ranks, ")"));
      }
    }
    auto size = shard_to_size.find(id);
    if (size == shard_to_size.end()) {
      return absl::InvalidArgumentError(absl::StrCat("shard '", id, "' has no size"));
    }
    if (size->second < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shard '", id, "' has negative size ", size->second));
    }
    Pending p{&id, ranks, size->second, cross_group_shards.contains(id)};
    std::sort(p.ranks.begin(), p.ranks.end());
    p.ranks.erase(std::unique(p.ranks.begin(), p.ranks.end()), p.ranks.end());
    pending.push_back(std::move(p));
  }
  std::sort(pending.begin(), pending.end(), [](const Pending& a, const Pending& b) {
    const size_t ca = a.ranks.size(), cb = b.ranks.size();
    return std::tie(a.cross_group, ca, b.size, *a.id) <
           std::tie(b.cross_group, cb, a.size, *b.id);  // Sizes swapped: larger first.
  });
  absl::flat_hash_map<int64_t, int64_t> load;  // Only ranks that hold something.
  absl::btree_map<std::string, int64_t> out;
  for (const Pending& p : pending) {
    int64_t best = p.ranks[0];
    int64_t best_load = load[best];
    for (size_t i = 1; i < p.ranks.size(); ++i) {
      const int64_t l = load[p.ranks[i]];
      if (l < best_load) {  // Strict: ranks are ascending, so ties keep the lowest.
        best = p.ranks[i];
        best_load = l;
      }
    }
    absl::StatusOr<int64_t> next = CheckedAdd(best_load, p.size);
    if (!next.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("load of rank ", best, " overflows int64 at shard '", *p.id, "'"));
    }
    load[best] = *next;
    out.emplace(*p.id, best);
  }
  return out;
}

}  // namespace shardcoord
