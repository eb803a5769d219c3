#include "sharding/planner.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/cost_model.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/test_layouts.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

Plan MustPlan(const Layout& s, const Layout& t, DType dtype = DType::kF32,
              const PlanOptions& options = {}) {
  absl::StatusOr<Plan> plan = Redistribute(s, t, dtype, options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

std::map<StepOp, int> CountOps(const Plan& plan) {
  std::map<StepOp, int> n;
  for (const Step& s : plan.steps) ++n[s.op];
  return n;
}

int64_t MaxSent(const Plan& plan) {
  int64_t m = 0;
  for (const RankTraffic& t : plan.traffic) m = std::max(m, t.bytes_sent);
  return m;
}

TEST(PlannerTest, ShardSwapOn2dMeshIsAllToAllNeverAllGather) {
  const Layout s = Placed({2, 4}, {}, {64, 48}, "S(0),S(1)");
  const Layout t = Placed({2, 4}, {}, {64, 48}, "S(1),S(0)");
  const Plan plan = MustPlan(s, t);
  const auto ops = CountOps(plan);
  EXPECT_GE(ops.count(StepOp::kAllToAll) ? ops.at(StepOp::kAllToAll) : 0, 1);
  EXPECT_EQ(ops.count(StepOp::kAllGather), 0u);
  EXPECT_EQ(plan.bytes_moved, plan.lower_bound_bytes);
  // The lower bound, counted directly: each rank's target minus what it holds.
  int64_t lb = 0;
  for (const RankChunks& rc : t.ranks()) {
    const Box& need = rc.chunks[0].box;
    const Box& have = s.Find(rc.rank)->chunks[0].box;
    lb += (need.Volume() - need.Intersect(have).Volume()) * 4;
  }
  EXPECT_EQ(plan.lower_bound_bytes, lb);
  // Disjoint groups run side by side: the plan takes as long as its busiest rank.
  double sum = 0, longest = 0;
  for (const Step& step : plan.steps) {
    sum += step.estimated_seconds;
    longest = std::max(longest, step.estimated_seconds);
  }
  ASSERT_GE(plan.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(plan.estimated_seconds, longest);
  EXPECT_LT(plan.estimated_seconds, sum);
  EXPECT_DOUBLE_EQ(plan.estimated_seconds, EstimatePlan(CostModel(), HostMap(), plan));
  const std::string explain = ExplainPlan(plan);
  EXPECT_THAT(explain, HasSubstr("all_to_all"));
  EXPECT_THAT(explain, Not(HasSubstr("all_gather")));
}

TEST(PlannerTest, ShardToShardWithinSubGroupsIsAllToAllPerGroup) {
  const Layout s = Placed({2, 4}, {}, {16, 16}, "S(0),S(1)");
  const Layout t = Placed({2, 4}, {}, {16, 16}, "S(0),S(0)");
  const Plan plan = MustPlan(s, t);
  ASSERT_EQ(plan.steps.size(), 2u);
  EXPECT_EQ(plan.steps[0].op, StepOp::kAllToAll);
  EXPECT_EQ(plan.steps[1].op, StepOp::kAllToAll);
  EXPECT_THAT(plan.steps[0].ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(plan.steps[1].ranks, ElementsAre(4, 5, 6, 7));
  EXPECT_EQ(plan.bytes_moved, plan.lower_bound_bytes);
  // Each of the 8 ranks needs 2x16 elements and holds 2x4 of them.
  EXPECT_EQ(plan.bytes_moved, 8 * 2 * 12 * 4);
}

TEST(PlannerTest, ShardSwapOn3dMeshStaysInAffectedSubGroups) {
  const Layout s = Placed({2, 2, 2}, {}, {8, 8}, "R,S(0),R");
  const Layout t = Placed({2, 2, 2}, {}, {8, 8}, "R,S(1),R");
  const Plan plan = MustPlan(s, t);
  absl::StatusOr<std::vector<std::vector<int64_t>>> groups =
      s.mesh()->SubGroups(std::vector<int>{1});
  ASSERT_TRUE(groups.ok());
  std::set<std::vector<int64_t>> expected(groups->begin(), groups->end());
  ASSERT_EQ(plan.steps.size(), 4u);
  for (const Step& step : plan.steps) {
    EXPECT_EQ(step.op, StepOp::kAllToAll);
    EXPECT_TRUE(expected.count(step.ranks)) << ::testing::PrintToString(step.ranks);
  }
  EXPECT_EQ(plan.bytes_moved, plan.lower_bound_bytes);
}

TEST(PlannerTest, ShardReplicateToReplicateShardIsAllGatherAlongDim0) {
  const Layout s = Placed({2, 4}, {}, {64, 48}, "S(0),R");
  const Layout t = Placed({2, 4}, {}, {64, 48}, "R,S(1)");
  const Plan plan = MustPlan(s, t);
  ASSERT_EQ(plan.steps.size(), 4u);
  for (const Step& step : plan.steps) {
    EXPECT_EQ(step.op, StepOp::kAllGather);
    ASSERT_EQ(step.ranks.size(), 2u);
    EXPECT_EQ(step.ranks[1] - step.ranks[0], 4);  // {b, 4+b}: a dim-0 sub-group.
  }
  // Every rank needs the other row half of its 12 columns: 32x12 f32.
  EXPECT_EQ(plan.bytes_moved, 8 * 32 * 12 * 4);
  EXPECT_EQ(plan.bytes_moved, plan.lower_bound_bytes);
}

TEST(PlannerTest, CrossMeshToDisjointAndOverlappingRanks) {
  const Layout s = Placed({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7}, {64, 48}, "S(0),R");
  const Layout t = Placed({4}, {4, 5, 6, 7}, {64, 48}, "S(1)");
  const Plan plan = MustPlan(s, t);
  // Ranks 4..7 hold rows 32..63; each needs rows 0..31 of its 12 columns from ranks 0..3.
  EXPECT_EQ(plan.lower_bound_bytes, 4 * 32 * 12 * 4);
  EXPECT_EQ(plan.bytes_moved, plan.lower_bound_bytes);
  EXPECT_EQ(MaxSent(plan), 32 * 12 * 4);  // Spread over the four replicas.
  for (const Transfer& tr : plan.AllTransfers()) {
    EXPECT_LT(tr.src, 4);
    EXPECT_GE(tr.dst, 4);
  }
  EXPECT_EQ(plan.local_copies.size(), 4u);
}

TEST(PlannerTest, CrossMeshPermutedRanks) {
  const Layout s = Placed({4}, {3, 1, 0, 2}, {8, 8}, "S(0)");
  const Layout t = Placed({4}, {0, 1, 2, 3}, {8, 8}, "S(0)");
  const Plan plan = MustPlan(s, t);
  // Rank 1 holds rows 2..3 on both sides; the other three ranks each need 2x8 elements.
  EXPECT_EQ(plan.bytes_moved, 3 * 2 * 8 * 4);
  EXPECT_EQ(plan.bytes_moved, plan.lower_bound_bytes);
}

TEST(PlannerTest, ReplicateToShardIsALocalSlice) {
  const Layout s = Placed({4}, {}, {64, 48}, "R");
  const Layout t = Placed({4}, {}, {64, 48}, "S(0)");
  const Plan plan = MustPlan(s, t);
  EXPECT_TRUE(plan.steps.empty());
  EXPECT_EQ(plan.bytes_moved, 0);
  EXPECT_EQ(plan.lower_bound_bytes, 0);
  ASSERT_EQ(plan.local_copies.size(), 4u);
  EXPECT_EQ(plan.local_copies[2].rank, 2);
  EXPECT_EQ(plan.local_copies[2].box, Box({32, 0}, {16, 48}));
}

TEST(PlannerTest, UnevenShardsAreNotPadded) {
  const Layout s = Placed({2}, {}, {8, 4}, "S(0,[1,7])");
  const Layout t = Placed({2}, {}, {8, 4}, "S(0)");
  const Plan plan = MustPlan(s, t);
  ASSERT_EQ(plan.steps.size(), 1u);
  ASSERT_EQ(plan.steps[0].transfers.size(), 1u);
  const Transfer& tr = plan.steps[0].transfers[0];
  EXPECT_EQ(tr.src, 1);
  EXPECT_EQ(tr.dst, 0);
  EXPECT_EQ(tr.box, Box({1, 0}, {3, 4}));
  EXPECT_EQ(plan.bytes_moved, 3 * 4 * 4);
}

TEST(PlannerTest, FlatToPlacements) {
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create({2});
  ASSERT_TRUE(mesh.ok());
  absl::StatusOr<FlatSpec> spec = ParseFlatSpec("0:10;10:32");
  ASSERT_TRUE(spec.ok());
  absl::StatusOr<Layout> s = Layout::FromFlat(*mesh, {4, 8}, *spec);
  ASSERT_TRUE(s.ok()) << s.status();
  const Layout t = Placed({2}, {}, {4, 8}, "S(1)");
  const Plan plan = MustPlan(*s, t, DType::kBF16);
  // Rank 0 holds flat 0..9 (row 0, row 1 cols 0..1) and needs cols 0..3 of every row: it
  // holds 6 of those 16. Rank 1 holds the rest and lacks only row 0 cols 4..7 of its 16.
  EXPECT_EQ(plan.lower_bound_bytes, (10 + 4) * 2);
  EXPECT_EQ(plan.bytes_moved, plan.lower_bound_bytes);
}

TEST(PlannerTest, GatherToOneRank) {
  const Layout s = Placed({4}, {}, {64, 48}, "S(0)");
  absl::StatusOr<Plan> plan = Gather(s, {2}, DType::kF32);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes_moved, 3 * 16 * 48 * 4);
  EXPECT_EQ(plan->bytes_moved, plan->lower_bound_bytes);
  for (const Transfer& tr : plan->AllTransfers()) EXPECT_EQ(tr.dst, 2);
  ASSERT_EQ(plan->target.ranks().size(), 1u);
  EXPECT_EQ(plan->target.ranks()[0].chunks[0].box, Box({0, 0}, {64, 48}));
}

TEST(PlannerTest, GatherToAllSourceRanksIsAllGather) {
  const Layout s = Placed({4}, {}, {64, 48}, "S(0)");
  absl::StatusOr<Plan> plan = Gather(s, {0, 1, 2, 3}, DType::kF32);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ(plan->steps.size(), 1u);
  EXPECT_EQ(plan->steps[0].op, StepOp::kAllGather);
  EXPECT_THAT(plan->steps[0].ranks, ElementsAre(0, 1, 2, 3));
}

TEST(PlannerTest, GatherRejectsBadDestinations) {
  const Layout s = Placed({4}, {}, {8}, "S(0)");
  EXPECT_EQ(Gather(s, {}, DType::kF32).status().code(), absl::StatusCode::kInvalidArgument);
  absl::Status dup = Gather(s, {1, 1}, DType::kF32).status();
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dup.message()), HasSubstr("1"));
}

TEST(PlannerTest, BroadcastFromTheOnlyHolder) {
  const Layout s = Placed({1}, {0}, {1024}, "R");
  const Layout t = Placed({4}, {}, {1024}, "R");
  const Plan plan = MustPlan(s, t);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.steps[0].op, StepOp::kBroadcast);
  EXPECT_EQ(plan.steps[0].root, 0);
}

TEST(PlannerTest, PartialSumToReplicateIsAllReduce) {
  const Layout s = Placed({4}, {}, {1024, 1024}, "P(sum)");
  const Layout t = Placed({4}, {}, {1024, 1024}, "R");
  const Plan plan = MustPlan(s, t);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.steps[0].op, StepOp::kAllReduce);
  EXPECT_EQ(plan.steps[0].reduce_op, ReduceOp::kSum);
  EXPECT_THAT(plan.steps[0].ranks, ElementsAre(0, 1, 2, 3));
  ASSERT_EQ(plan.local_copies.size(), 4u);
  for (const LocalCopy& c : plan.local_copies) {
    EXPECT_TRUE(c.reduce);
    EXPECT_EQ(c.partial_index, c.rank);
    EXPECT_EQ(c.collective_step, 0);
  }
  // Element movement: every rank receives the three other contributions.
  EXPECT_EQ(plan.bytes_moved, 4 * 3 * int64_t{1024} * 1024 * 4);
  EXPECT_EQ(plan.bytes_moved, plan.lower_bound_bytes);
  // The ring all-reduce moves 2(n-1)/n of the buffer per rank, well under point-to-point.
  const CostModel m;
  EXPECT_DOUBLE_EQ(plan.steps[0].estimated_seconds,
                   EstimateAllReduce(m, 4, int64_t{1024} * 1024 * 4, false));
  EXPECT_LT(plan.steps[0].estimated_seconds,
            EstimatePointToPoint(m, HostMap(), plan.steps[0].transfers));
}

TEST(PlannerTest, TinyAllReduceOnTwoRanksIsCheaperAsExchange) {
  // The cost model picks between equivalent lowerings: with two ranks the ring pays two
  // latencies for the same bytes a single exchange moves.
  const Layout s = Placed({2}, {}, {16}, "P(sum)");
  const Layout t = Placed({2}, {}, {16}, "R");
  const Plan plan = MustPlan(s, t);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.steps[0].op, StepOp::kPointToPoint);
  for (const LocalCopy& c : plan.local_copies) EXPECT_EQ(c.collective_step, -1);
}

TEST(PlannerTest, PartialSumToShardIsReduceScatter) {
  const Layout s = Placed({4}, {}, {64, 48}, "P(sum)");
  const Layout t = Placed({4}, {}, {64, 48}, "S(0)");
  const Plan plan = MustPlan(s, t);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.steps[0].op, StepOp::kReduceScatter);
  EXPECT_THAT(plan.steps[0].ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(plan.bytes_moved, 4 * 3 * 16 * 48 * 4);
  for (const LocalCopy& c : plan.local_copies) EXPECT_EQ(c.collective_step, 0);
}

TEST(PlannerTest, PartialOnOneDimReducesWithinItsSubGroups) {
  const Layout s = Placed({2, 4}, {}, {1024, 512}, "R,P(max)");
  const Layout t = Placed({2, 4}, {}, {1024, 512}, "R,R");
  const Plan plan = MustPlan(s, t);
  ASSERT_EQ(plan.steps.size(), 2u);
  EXPECT_EQ(plan.steps[0].op, StepOp::kAllReduce);
  EXPECT_EQ(plan.steps[0].reduce_op, ReduceOp::kMax);
  EXPECT_THAT(plan.steps[0].ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(plan.steps[1].ranks, ElementsAre(4, 5, 6, 7));
}

TEST(PlannerTest, PartialAvgSumsThenDivides) {
  const Layout s = Placed({4}, {}, {8}, "P(avg)");
  const Layout t = Placed({2}, {10, 11}, {8}, "S(0)");
  const Plan plan = MustPlan(s, t);
  EXPECT_EQ(plan.divide_by, 4);
  EXPECT_EQ(plan.reduce_op, ReduceOp::kSum);
  for (const Transfer& tr : plan.AllTransfers()) EXPECT_TRUE(tr.reduce);
  // Each of the two destinations receives all four contributions of its half.
  EXPECT_EQ(plan.bytes_moved, 2 * 4 * 4 * 4);
}

TEST(PlannerTest, PartialTargets) {
  const Layout s = Placed({4}, {}, {8}, "R");
  const Layout t = Placed({4}, {}, {8}, "P(sum)");
  const Plan plan = MustPlan(s, t);
  EXPECT_TRUE(plan.steps.empty());
  EXPECT_THAT(plan.zero_fill_ranks, ElementsAre(1, 2, 3));
  ASSERT_EQ(plan.local_copies.size(), 1u);
  EXPECT_EQ(plan.local_copies[0].rank, 0);

  const Plan keep = MustPlan(t, t);  // Same Partial layout: nothing to reduce or move.
  EXPECT_TRUE(keep.steps.empty());
  EXPECT_TRUE(keep.zero_fill_ranks.empty());
  ASSERT_EQ(keep.local_copies.size(), 4u);
  for (const LocalCopy& c : keep.local_copies) {
    EXPECT_FALSE(c.reduce);
    EXPECT_EQ(c.partial_index, c.rank);
  }

  const Layout tmax = Placed({4}, {}, {8}, "P(max)");
  const Plan to_max = MustPlan(s, tmax);  // Every contribution holds the value.
  EXPECT_TRUE(to_max.zero_fill_ranks.empty());
  EXPECT_EQ(to_max.local_copies.size(), 4u);
}

TEST(PlannerTest, ShapeMismatchIsInvalidArgument) {
  const Layout s = Placed({2}, {}, {8, 4}, "S(0)");
  const Layout t = Placed({2}, {}, {8, 5}, "S(0)");
  absl::StatusOr<Plan> plan = Redistribute(s, t, DType::kF32);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("[8, 4]"));
  EXPECT_THAT(std::string(plan.status().message()), HasSubstr("[8, 5]"));
  EXPECT_EQ(Redistribute(Layout(), t, DType::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlannerTest, SendersAreBalancedAcrossReplicas) {
  // Four replicas feed twelve new ranks: three pieces each.
  const Layout s = Placed({4}, {0, 1, 2, 3}, {1200, 100}, "R");
  std::vector<int64_t> dst;
  for (int64_t r = 4; r < 16; ++r) dst.push_back(r);
  const Layout t = Placed({12}, dst, {1200, 100}, "S(0)");
  const Plan plan = MustPlan(s, t);
  EXPECT_EQ(MaxSent(plan), 3 * 100 * 100 * 4);

  // Three replicas feed one new rank: the tensor is split three ways.
  const Layout s3 = Placed({3}, {0, 1, 2}, {999, 100}, "R");
  const Layout t1 = Placed({1}, {7}, {999, 100}, "R");
  const Plan split = MustPlan(s3, t1);
  const double ideal = 999.0 * 100 * 4 / 3;
  EXPECT_LE(MaxSent(split), 1.1 * ideal);
  EXPECT_EQ(split.bytes_moved, 999 * 100 * 4);
  EXPECT_EQ(split.AllTransfers().size(), 3u);
}

TEST(PlannerTest, SendersPreferTheDestinationsHost) {
  const Layout s = Placed({2}, {0, 4}, {256, 64}, "R");
  const Layout t = Placed({8}, {}, {256, 64}, "R");
  PlanOptions options;
  //             rank: 0     1     2     3     4     5     6     7
  options.hosts_by_rank = {"h0", "h1", "h1", "h1", "h1", "h0", "h0", "h0"};
  const Plan plan = MustPlan(s, t, DType::kF32, options);
  const HostMap hosts = HostMapFor(options);
  const std::vector<Transfer> all = plan.AllTransfers();
  ASSERT_EQ(all.size(), 6u);
  for (const Transfer& tr : all) {
    EXPECT_TRUE(hosts.SameHost(tr.src, tr.dst)) << tr.src << "->" << tr.dst;
  }
  EXPECT_EQ(MaxSent(plan), 3 * 256 * 64 * 4);
  // Two broadcasts, one per host.
  ASSERT_EQ(plan.steps.size(), 2u);
  EXPECT_EQ(plan.steps[0].op, StepOp::kBroadcast);
  EXPECT_EQ(plan.steps[0].root, 0);
  EXPECT_THAT(plan.steps[0].ranks, ElementsAre(0, 5, 6, 7));
  EXPECT_EQ(plan.steps[1].root, 4);

  // Without host names the same senders are still balanced, but not host-aligned.
  const Plan blind = MustPlan(s, t);
  EXPECT_EQ(MaxSent(blind), 3 * 256 * 64 * 4);
  int cross = 0;
  for (const Transfer& tr : blind.AllTransfers()) cross += !hosts.SameHost(tr.src, tr.dst);
  EXPECT_GT(cross, 0);
}

TEST(PlannerTest, ALocalCopyWinsOverBalanceAndCrossHostBytesMeetTheirBound) {
  // Replicas on rank 0 (h0) and ranks 1-3 (h1); every destination (4-7) is on h0. Balance
  // alone would have ranks 1-3 send three quarters across hosts; host-aware, rank 0 sends all.
  const Layout s = Placed({4}, {0, 1, 2, 3}, {64, 16}, "R");
  const Layout t = Placed({4}, {4, 5, 6, 7}, {64, 16}, "S(0)");
  PlanOptions options;
  options.hosts_by_rank = {"h0", "h1", "h1", "h1", "h0", "h0", "h0", "h0"};
  const Plan plan = MustPlan(s, t, DType::kF32, options);
  EXPECT_EQ(plan.bytes_moved, 64 * 16 * 4);
  EXPECT_EQ(plan.bytes_across_hosts, 0);
  EXPECT_EQ(plan.bytes_within_hosts, plan.bytes_moved);
  EXPECT_EQ(plan.cross_host_lower_bound_bytes, 0);
  for (const Transfer& tr : plan.AllTransfers()) EXPECT_EQ(tr.src, 0);
  EXPECT_THAT(ExplainPlan(plan), HasSubstr("hosts: 4096 bytes within hosts, 0 across hosts"));

  // A destination on h2 has no copy on its host: its piece must cross, and only its piece.
  options.hosts_by_rank[7] = "h2";
  const Plan mixed = MustPlan(s, t, DType::kF32, options);
  EXPECT_EQ(mixed.cross_host_lower_bound_bytes, 16 * 16 * 4);
  EXPECT_EQ(mixed.bytes_across_hosts, mixed.cross_host_lower_bound_bytes);
  EXPECT_THAT(ExplainPlan(mixed), HasSubstr("cross-host lower bound 1024"));

  // Hosts unknown: every rank is alone, so every byte counts as crossing.
  const Plan blind = MustPlan(s, t);
  EXPECT_EQ(blind.bytes_across_hosts, blind.bytes_moved);
  EXPECT_EQ(blind.cross_host_lower_bound_bytes, blind.lower_bound_bytes);
}

TEST(PlannerTest, WithoutCollectivesEverythingIsOnePointToPointStep) {
  const Layout s = Placed({2, 4}, {}, {64, 48}, "S(0),R");
  const Layout t = Placed({2, 4}, {}, {64, 48}, "R,S(1)");
  PlanOptions options;
  options.use_collectives = false;
  const Plan plan = MustPlan(s, t, DType::kF32, options);
  ASSERT_EQ(plan.steps.size(), 1u);
  EXPECT_EQ(plan.steps[0].op, StepOp::kPointToPoint);
  EXPECT_THAT(plan.steps[0].ranks, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  EXPECT_EQ(plan.bytes_moved, MustPlan(s, t).bytes_moved);
}

TEST(PlannerTest, Deterministic) {
  const Layout s = Placed({2, 3}, {5, 0, 3, 1, 4, 2}, {30, 20}, "S(1),R");
  const Layout t = Placed({3, 2}, {2, 3, 4, 5, 6, 7}, {30, 20}, "S(0),S(1)");
  PlanOptions options;
  options.ranks_per_host = 4;
  const Plan a = MustPlan(s, t, DType::kF32, options);
  const Plan b = MustPlan(s, t, DType::kF32, options);
  EXPECT_EQ(a.local_copies, b.local_copies);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    EXPECT_EQ(a.steps[i].op, b.steps[i].op);
    EXPECT_EQ(a.steps[i].ranks, b.steps[i].ranks);
    EXPECT_EQ(a.steps[i].transfers, b.steps[i].transfers);
  }
  EXPECT_EQ(ExplainPlan(a), ExplainPlan(b));
}

TEST(PlannerTest, ExplainShowsStepsBytesAndEstimates) {
  const Layout s = Placed({2, 4}, {}, {64, 48}, "S(0),S(1)");
  const Layout t = Placed({2, 4}, {}, {64, 48}, "S(1),S(0)");
  const std::string text = ExplainPlan(MustPlan(s, t));
  EXPECT_THAT(text, HasSubstr("S(0),S(1) on mesh 2x4 -> S(1),S(0) on mesh 2x4"));
  EXPECT_THAT(text, HasSubstr("lower bound"));
  EXPECT_THAT(text, HasSubstr("estimated"));
  EXPECT_THAT(text, HasSubstr("per-rank bytes"));
  EXPECT_THAT(text, HasSubstr("rank 7:"));
}

TEST(PlanCacheTest, HitsMissesAndEviction) {
  const Layout a = Placed({4}, {}, {64}, "S(0)");
  const Layout b = Placed({4}, {}, {64}, "R");
  const Layout c = Placed({2}, {}, {64}, "S(0)");
  PlanCache cache(2);
  absl::StatusOr<std::shared_ptr<const Plan>> p1 = cache.GetOrPlan(a, b, DType::kF32);
  ASSERT_TRUE(p1.ok());
  absl::StatusOr<std::shared_ptr<const Plan>> p2 = cache.GetOrPlan(a, b, DType::kF32);
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(p1->get(), p2->get());
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 1);
  // Another dtype or other options are other plans.
  ASSERT_TRUE(cache.GetOrPlan(a, b, DType::kBF16).ok());
  PlanOptions hosts;
  hosts.ranks_per_host = 2;
  EXPECT_NE(PlanCache::Key(a, b, DType::kF32, hosts), PlanCache::Key(a, b, DType::kF32, {}));
  EXPECT_EQ(cache.size(), 2u);
  ASSERT_TRUE(cache.GetOrPlan(a, c, DType::kF32).ok());  // Evicts (a, b, f32).
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_EQ(cache.Find(PlanCache::Key(a, b, DType::kF32, {})), nullptr);
  EXPECT_NE(cache.Find(PlanCache::Key(a, c, DType::kF32, {})), nullptr);
  EXPECT_FALSE(cache.GetOrPlan(a, Placed({2}, {}, {65}, "R"), DType::kF32).ok());
}

TEST(CostModelTest, Formulas) {
  CostModel m;
  m.intra_alpha_s = 1;
  m.intra_beta_s_per_byte = 0.5;
  m.inter_alpha_s = 10;
  m.inter_beta_s_per_byte = 2;
  EXPECT_DOUBLE_EQ(EstimateAllGather(m, 4, 100, true), 3 * (1 + 50));
  EXPECT_DOUBLE_EQ(EstimateReduceScatter(m, 4, 100, false), 3 * (10 + 200));
  EXPECT_DOUBLE_EQ(EstimateAllReduce(m, 4, 400, true), 6 * 1 + 1.5 * 400 * 0.5);
  EXPECT_DOUBLE_EQ(EstimateBroadcast(m, 4, 100, true), 2 * 1 + 50);
  EXPECT_DOUBLE_EQ(EstimateAllReduce(m, 1, 400, true), 0);
  // Point-to-point: rank 0 sends 100 B to 1 (same host) and 100 B to 2 (other host).
  const HostMap hosts = HostMap::FromNames({"a", "a", "b"});
  std::vector<Transfer> t(2);
  t[0].src = 0, t[0].dst = 1, t[0].bytes = 100;
  t[1].src = 0, t[1].dst = 2, t[1].bytes = 100;
  EXPECT_DOUBLE_EQ(EstimatePointToPoint(m, hosts, t), (1 + 50) + (10 + 200));
}

TEST(CostModelTest, ParseAndHosts) {
  absl::StatusOr<CostModel> m = ParseCostModel("intra_alpha_us=2, inter_gbps=25");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_DOUBLE_EQ(m->intra_alpha_s, 2e-6);
  EXPECT_DOUBLE_EQ(m->inter_beta_s_per_byte, 1 / 25e9);
  EXPECT_DOUBLE_EQ(m->inter_alpha_s, CostModel().inter_alpha_s);
  absl::Status bad = ParseCostModel("inter_gbps=-1").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("inter_gbps=-1"));
  EXPECT_THAT(std::string(ParseCostModel("speed=3").status().message()), HasSubstr("speed"));

  const HostMap none;
  EXPECT_FALSE(none.SameHost(0, 1));
  EXPECT_TRUE(none.SameHost(3, 3));
  const HostMap blocks = HostMap::Blocks(8);
  EXPECT_TRUE(blocks.SameHost(8, 15));
  EXPECT_FALSE(blocks.SameHost(7, 8));
  const HostMap named = HostMap::FromNames({"x", "y", "x", ""});
  EXPECT_TRUE(named.SameHost(0, 2));
  EXPECT_FALSE(named.SameHost(0, 1));
  EXPECT_FALSE(named.SameHost(3, 5));  // Unknown ranks are alone.
}

TEST(PlannerTest, CastPlansCountTheNarrowerDTypeAndSayWhoConverts) {
  const Layout s = Placed({2}, {0, 1}, {8, 4}, "S(0)");
  const Layout t = Placed({2}, {2, 3}, {8, 4}, "S(1)");
  const Plan same = MustPlan(s, t, DType::kF32);
  absl::StatusOr<Plan> narrow = Redistribute(s, t, DType::kF32, DType::kF8E4M3, {});
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  EXPECT_EQ(narrow->dtype, DType::kF32);
  EXPECT_EQ(narrow->target_dtype(), DType::kF8E4M3);
  EXPECT_EQ(narrow->wire_dtype(), DType::kF8E4M3);
  EXPECT_EQ(narrow->cast_side(), CastSide::kSender);
  EXPECT_EQ(narrow->bytes_moved * 4, same.bytes_moved);
  EXPECT_EQ(narrow->lower_bound_bytes, 8 * 4);
  EXPECT_THAT(ExplainPlan(*narrow), HasSubstr("cast f32 -> f8_e4m3 by the sender"));

  absl::StatusOr<Plan> wide = Redistribute(s, t, DType::kBF16, DType::kF32, {});
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->wire_dtype(), DType::kBF16);
  EXPECT_EQ(wide->cast_side(), CastSide::kReceiver);
  EXPECT_EQ(wide->bytes_moved * 2, same.bytes_moved);

  absl::StatusOr<Plan> plain = Redistribute(s, t, DType::kI32, DType::kI32, {});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->cast_to.has_value());
  EXPECT_EQ(plain->cast_side(), CastSide::kNone);

  absl::StatusOr<Plan> refused = Redistribute(s, t, DType::kF32, DType::kI32, {});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("f32"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("i32"));

  const Layout partial = Placed({2}, {0, 1}, {8, 4}, "P(sum)");
  absl::StatusOr<Plan> f8_partial = Redistribute(partial, t, DType::kF8E4M3);
  ASSERT_EQ(f8_partial.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(f8_partial.status().message()), HasSubstr("f8_e4m3"));
  EXPECT_EQ(Redistribute(t, partial, DType::kBool).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Redistribute(partial, t, DType::kF32, DType::kBF16, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlanCacheTest, CastPlansAreKeyedByBothDTypes) {
  const Layout a = Placed({2}, {8, 4}, "S(0)");
  const Layout b = Placed({2}, {8, 4}, "S(1)");
  EXPECT_NE(PlanCache::Key(a, b, DType::kF32, DType::kBF16, {}),
            PlanCache::Key(a, b, DType::kF32, {}));
  EXPECT_EQ(PlanCache::Key(a, b, DType::kF32, DType::kF32, {}),
            PlanCache::Key(a, b, DType::kF32, {}));
  PlanCache cache;
  absl::StatusOr<std::shared_ptr<const Plan>> p =
      cache.GetOrPlan(a, b, DType::kF32, DType::kBF16, {});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ((*p)->target_dtype(), DType::kBF16);
  absl::StatusOr<std::shared_ptr<const Plan>> q = cache.GetOrPlan(a, b, DType::kF32, {});
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE((*q)->cast_to.has_value());
  EXPECT_EQ(cache.misses(), 2);
}

}  // namespace
}  // namespace shardcoord
