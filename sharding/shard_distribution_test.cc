#include "sharding/shard_distribution.h"

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;
using RankMap = absl::btree_map<std::string, std::vector<int64_t>>;
using SizeMap = absl::btree_map<std::string, int64_t>;
using Assignment = absl::btree_map<std::string, int64_t>;

TEST(DistributeShardsToRanksTest, WorkedOrdering) {
  const RankMap ranks = {
      {"a", {0, 1}}, {"b", {1, 0}}, {"c", {1}}, {"d", {0, 1, 2}}, {"x", {2, 0, 1}}};
  const SizeMap sizes = {{"a", 10}, {"b", 20}, {"c", 5}, {"d", 30}, {"x", 100}};
  // c (coverage 1) -> 1. Coverage 2, larger first: b -> 0 (loads 0, 5), a -> 1 (20, 5).
  // d -> 2 (loads 20, 15, 0). Cross-group x last -> 1 (loads 20, 15, 30).
  absl::StatusOr<Assignment> got = DistributeShardsToRanks(ranks, sizes, 3, {"x"});
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (Assignment{{"a", 1}, {"b", 0}, {"c", 1}, {"d", 2}, {"x", 1}}));
  // Without the cross-group mark x (coverage 3, size 100) goes before d: x -> 2, d -> 1.
  got = DistributeShardsToRanks(ranks, sizes, 3);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (Assignment{{"a", 1}, {"b", 0}, {"c", 1}, {"d", 1}, {"x", 2}}));
}

TEST(DistributeShardsToRanksTest, TiesGoToLowerIdAndLowerRank) {
  // Equal coverage and size: "p" before "q"; p takes the lowest of the idle ranks.
  absl::StatusOr<Assignment> got =
      DistributeShardsToRanks({{"q", {3, 2}}, {"p", {2, 3}}}, {{"p", 7}, {"q", 7}}, 4);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (Assignment{{"p", 2}, {"q", 3}}));
  // Zero-size shards still count as placed but add no load: all go to the lowest rank.
  got = DistributeShardsToRanks({{"e", {1, 0}}, {"f", {0, 1}}}, {{"e", 0}, {"f", 0}}, 2);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, (Assignment{{"e", 0}, {"f", 0}}));
}

TEST(DistributeShardsToRanksTest, DeterministicUnderInputPermutation) {
  std::mt19937_64 rng(5);
  std::vector<std::tuple<std::string, std::vector<int64_t>, int64_t>> shards;
  for (int i = 0; i < 60; ++i) {
    std::vector<int64_t> holders;
    for (int64_t r = 0; r < 6; ++r) {
      if (rng() % 2) holders.push_back(r);
    }
    if (holders.empty()) holders.push_back(rng() % 6);
    shards.emplace_back(absl::StrCat("layer.", i), holders, 1 + rng() % 50);
  }
  absl::StatusOr<Assignment> first;
  for (int trial = 0; trial < 10; ++trial) {
    std::shuffle(shards.begin(), shards.end(), rng);
    RankMap ranks;
    SizeMap sizes;
    for (auto& [id, holders, size] : shards) {
      std::vector<int64_t> h = holders;
      std::shuffle(h.begin(), h.end(), rng);
      if (trial % 2) h.push_back(h.front());  // Duplicates change nothing.
      ranks.emplace(id, std::move(h));
      sizes.emplace(id, size);
    }
    absl::StatusOr<Assignment> got =
        DistributeShardsToRanks(ranks, sizes, 6, {"layer.3", "layer.17"});
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), shards.size());
    if (trial == 0) {
      first = got;
    } else {
      EXPECT_EQ(*got, *first) << "trial " << trial;
    }
  }
}

TEST(DistributeShardsToRanksTest, BalancedOnRandomInstances) {
  std::mt19937_64 rng(77);
  const int64_t num_ranks = 8;
  // Every shard replicated everywhere: greedy list scheduling keeps the largest load within
  // one shard of the mean.
  RankMap all;
  SizeMap sizes;
  int64_t total = 0, largest = 0;
  std::vector<int64_t> everyone = {0, 1, 2, 3, 4, 5, 6, 7};
  for (int i = 0; i < 300; ++i) {
    const std::string id = absl::StrCat("s", i);
    const int64_t size = 1 + rng() % 1000;
    all.emplace(id, everyone);
    sizes.emplace(id, size);
    total += size;
    largest = std::max(largest, size);
  }
  absl::StatusOr<Assignment> got = DistributeShardsToRanks(all, sizes, num_ranks);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<int64_t> load(num_ranks, 0);
  for (const auto& [id, r] : *got) load[r] += sizes.at(id);
  const int64_t max_load = *std::max_element(load.begin(), load.end());
  const int64_t min_load = *std::min_element(load.begin(), load.end());
  EXPECT_LE(max_load, total / num_ranks + largest);
  EXPECT_LE(max_load - min_load, largest);

  // Restricted holders: replay the documented order and check every shard went to a holder
  // whose load was the smallest among its holders at that moment.
  RankMap some;
  for (const auto& [id, unused] : all) {
    std::vector<int64_t> h;
    for (int64_t r = 0; r < num_ranks; ++r) {
      if (rng() % 3 == 0) h.push_back(r);
    }
    if (h.empty()) h.push_back(rng() % num_ranks);
    some.emplace(id, std::move(h));
  }
  got = DistributeShardsToRanks(some, sizes, num_ranks);
  ASSERT_TRUE(got.ok()) << got.status();
  std::vector<std::tuple<size_t, int64_t, std::string>> order;
  for (const auto& [id, h] : some) order.emplace_back(h.size(), -sizes.at(id), id);
  std::sort(order.begin(), order.end());
  std::fill(load.begin(), load.end(), 0);
  for (const auto& [coverage, neg_size, id] : order) {
    const int64_t r = got->at(id);
    const std::vector<int64_t>& h = some.at(id);
    ASSERT_NE(std::find(h.begin(), h.end(), r), h.end()) << id << " went to non-holder " << r;
    for (int64_t other : h) {
      EXPECT_LE(load[r], load[other]) << id;
      if (load[r] == load[other]) EXPECT_LE(r, other) << id;
    }
    load[r] += -neg_size;
  }
}

TEST(DistributeShardsToRanksTest, Errors) {
  absl::Status s = DistributeShardsToRanks({{"w", {}}}, {{"w", 1}}, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'w' has no ranks"));
  s = DistributeShardsToRanks({{"w", {0, 2}}}, {{"w", 1}}, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank 2 outside [0, 2)"));
  s = DistributeShardsToRanks({{"w", {-1}}}, {{"w", 1}}, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("rank -1"));
  s = DistributeShardsToRanks({{"w", {0}}}, {{"v", 1}}, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'w' has no size"));
  s = DistributeShardsToRanks({{"w", {0}}}, {{"w", -4}}, 2).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DistributeShardsToRanks({}, {}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  const int64_t big = std::numeric_limits<int64_t>::max();
  s = DistributeShardsToRanks({{"u", {0}}, {"v", {0}}}, {{"u", big}, {"v", big}}, 1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("overflows"));
  // An empty input is fine.
  absl::StatusOr<Assignment> none = DistributeShardsToRanks({}, {}, 4);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace shardcoord
