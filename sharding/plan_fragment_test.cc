#include "sharding/plan_fragment.h"

#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::TwoStepPlan;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

FragmentOptions Options(bool fused) {
  FragmentOptions o;
  o.plan_id = fused ? "g-1" : "p-1";
  o.fused = fused;
  o.incarnations = {{0, 10}, {1, 11}, {2, 12}, {3, 13}};
  o.step_timeout_ms = 500;
  o.communicator_prefix = "plan/p-1";
  o.bucket_bytes = 64;
  return o;
}

FragmentMemberOptions Member(int32_t index, const std::string& tensor) {
  FragmentMemberOptions m;
  m.index = index;
  m.plan_id = "p-" + tensor;
  m.tensor = tensor;
  m.source_version = 3;
  m.target_version = 4;
  return m;
}

TEST(PlanFragmentTest, APlanIsOneShapeWithOneMemberAndOnlyTheRanksSteps) {
  const Plan plan = TwoStepPlan();
  const Plan* plans[] = {&plan};
  FragmentMemberOptions member = Member(0, "T");
  member.plan_id.clear();  // The plan's id.
  std::map<int64_t, Fragment> fragments = MakeFragments(plans, {member}, Options(false));
  ASSERT_EQ(fragments.size(), 4u);
  const Fragment& f = fragments.at(2);
  EXPECT_EQ(f.plan_id, "p-1");
  EXPECT_EQ(f.rank, 2);
  EXPECT_FALSE(f.fused);
  ASSERT_EQ(f.shapes.size(), 1u);
  ASSERT_EQ(f.members.size(), 1u);
  const FragmentShape& s = f.shapes[0];
  EXPECT_EQ(s.rank, 2);
  ASSERT_EQ(s.num_steps(), 1u);
  EXPECT_THAT(s.step_indices, ElementsAre(1));
  EXPECT_EQ(s.step(0).transfers, plan.steps[1].transfers);
  EXPECT_THAT(s.steps, IsEmpty());  // Borrowed from the plan, not copied.
  EXPECT_THAT(s.transfers, IsEmpty());
  EXPECT_THAT(s.local_copies, ElementsAre(plan.local_copies[2]));
  EXPECT_EQ(s.source.chunks, plan.source.Find(2)->chunks);
  EXPECT_EQ(s.target.chunks, plan.target.Find(2)->chunks);
  EXPECT_THAT(f.member_incarnations, UnorderedElementsAre(Pair(2, 12), Pair(3, 13)));
  EXPECT_THAT(f.exchange_ranks, IsEmpty());
  EXPECT_EQ(f.members[0].plan_id, "p-1");
  EXPECT_EQ(f.members[0].tensor, "T");
  EXPECT_EQ(f.members[0].target_tensor, "T");  // Not a Copy: the tensor itself.
  EXPECT_EQ(f.members[0].source_version, 3);
  EXPECT_EQ(f.members[0].target_version, 4);
  EXPECT_EQ(&f.shape_of(0), &f.shapes[0]);
  EXPECT_EQ(f.step_timeout_ms, 500);
  EXPECT_EQ(f.communicator_prefix, "plan/p-1");
}

TEST(PlanFragmentTest, AttachedTargetsGoOnlyToTargetRanks) {
  Plan plan = TwoStepPlan();
  // Rank 3 holds source only.
  plan.target = *Layout::FromChunks({8}, {RankChunks{0, {}, {Chunk{Box({0}, {8}), 0, 0}}, 8}});
  const Plan* plans[] = {&plan};
  FragmentMemberOptions member = Member(0, "src");
  member.target_tensor = "dst";
  member.attached_target_version = 7;
  for (bool fused : {false, true}) {
    std::map<int64_t, Fragment> fragments = MakeFragments(plans, {member}, Options(fused));
    EXPECT_EQ(fragments.at(0).members[0].attached_target_version, 7) << fused;
    EXPECT_EQ(fragments.at(0).members[0].target_tensor, "dst");
    EXPECT_EQ(fragments.at(3).members[0].attached_target_version, 0) << fused;
  }
}

TEST(PlanFragmentTest, AFusedTransactionSharesShapesAndListsItsExchange) {
  const Plan a = TwoStepPlan();
  const Plan b = TwoStepPlan();
  // Members 0 and 2 run the same plan object: one shape.
  const Plan* plans[] = {&a, &b, &a};
  std::vector<FragmentMemberOptions> members = {Member(0, "x"), Member(1, "y"), Member(2, "z")};
  std::map<int64_t, Fragment> fragments = MakeFragments(plans, members, Options(true));
  ASSERT_EQ(fragments.size(), 4u);
  const Fragment& f = fragments.at(1);
  EXPECT_TRUE(f.fused);
  EXPECT_EQ(f.plan_id, "g-1");
  EXPECT_EQ(f.bucket_bytes, 64);
  ASSERT_EQ(f.shapes.size(), 2u);
  ASSERT_EQ(f.members.size(), 3u);
  EXPECT_EQ(f.members[0].shape, 0);
  EXPECT_EQ(f.members[1].shape, 1);
  EXPECT_EQ(f.members[2].shape, 0);
  EXPECT_EQ(f.members[2].plan_id, "p-z");
  EXPECT_EQ(f.members[2].index, 2);
  EXPECT_THAT(f.shapes[0].steps, IsEmpty());
  EXPECT_THAT(f.shapes[0].transfers, ElementsAre(a.steps[0].transfers[0], a.steps[0].transfers[1]));
  EXPECT_THAT(f.exchange_ranks, ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(f.member_incarnations,
              UnorderedElementsAre(Pair(0, 10), Pair(1, 11), Pair(2, 12), Pair(3, 13)));
}

TEST(PlanFragmentTest, ARankThatMovesNothingHasNoExchange) {
  Plan plan = TwoStepPlan();
  plan.steps.clear();
  const Plan* plans[] = {&plan};
  std::map<int64_t, Fragment> fragments = MakeFragments(plans, {Member(0, "x")}, Options(true));
  ASSERT_EQ(fragments.size(), 4u);
  EXPECT_THAT(fragments.at(0).exchange_ranks, IsEmpty());
  EXPECT_THAT(fragments.at(0).member_incarnations, IsEmpty());
  EXPECT_THAT(fragments.at(0).shapes[0].local_copies, ElementsAre(plan.local_copies[0]));
}

}  // namespace
}  // namespace shardcoord
