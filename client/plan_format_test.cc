#include "client/plan_format.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/planner.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// shardctl plan --mesh 2x4 --ranks 0,1,2,3,4,5,6,7 --shape 64,48 --dtype f32
//     --placements 'S(0),R' --to-mesh 4 --to-ranks 4,5,6,7 --to-placements 'S(1)'
PlanFlags IssueExample() {
  PlanFlags f;
  f.source.mesh = "2x4";
  f.source.ranks = "0,1,2,3,4,5,6,7";
  f.source.shape = "64,48";
  f.source.dtype = "f32";
  f.source.placements = "S(0),R";
  f.to_mesh = "4";
  f.to_ranks = "4,5,6,7";
  f.to_placements = "S(1)";
  return f;
}

TEST(PlanFormatTest, IssueExampleFollowsTheJsonContract) {
  absl::StatusOr<PlanInput> input = BuildPlanInput(IssueExample());
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->target.RankIds(), (std::vector<int64_t>{4, 5, 6, 7}));
  absl::StatusOr<Plan> plan =
      Redistribute(input->source, input->target, input->dtype, input->options);
  ASSERT_TRUE(plan.ok()) << plan.status();

  // Ranks 4..7 hold rows 32..63 already; each needs rows 0..31 of its 12 columns (32*12*4 B).
  EXPECT_EQ(plan->lower_bound_bytes, 4 * 32 * 12 * 4);
  EXPECT_EQ(plan->bytes_moved, plan->lower_bound_bytes);
  const std::vector<Transfer> transfers = plan->AllTransfers();
  ASSERT_FALSE(transfers.empty());
  int64_t sum = 0;
  for (const Transfer& t : transfers) {
    EXPECT_NE(t.src, t.dst);
    EXPECT_LT(t.src, 4) << "only ranks 0..3 hold rows 0..31";
    EXPECT_GE(t.dst, 4);
    const int64_t k = t.dst - 4;
    EXPECT_TRUE(Box({0, 12 * k}, {32, 12}).Contains(t.box)) << t.box.ToString();
    sum += t.bytes;
  }
  EXPECT_EQ(sum, plan->bytes_moved);

  const std::string json = PlanJson(*plan);
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  EXPECT_THAT(json, HasSubstr("{\"steps\": [{\"op\": "));
  EXPECT_THAT(json, HasSubstr("\"bytes_moved\": 6144, \"lower_bound_bytes\": 6144"));
  EXPECT_EQ(Count(json, "\"src\": "), static_cast<int>(transfers.size()));
  EXPECT_EQ(Count(json, "\"op\": "), static_cast<int>(plan->steps.size()));
  // The first transfer, in full.
  const Transfer& t = transfers[0];
  EXPECT_THAT(json, HasSubstr(absl::StrCat("\"transfers\": [{\"step\": 0, \"src\": ", t.src,
                                           ", \"dst\": ", t.dst, ", \"offset\": [", t.box.offset(0),
                                           ", ", t.box.offset(1), "], \"shape\": [", t.box.shape(0),
                                           ", ", t.box.shape(1), "], \"bytes\": ", t.bytes, "}")));
  // Deterministic.
  EXPECT_EQ(PlanJson(*Redistribute(input->source, input->target, input->dtype, input->options)),
            json);
}

TEST(PlanFormatTest, ShardSwapOn2dMeshIsAllToAllWithoutAllGather) {
  // shardctl plan --mesh 2x4 --shape 64,48 --placements 'S(0),S(1)' --to-placements 'S(1),S(0)'
  // --explain
  PlanFlags f;
  f.source.mesh = "2x4";
  f.source.shape = "64,48";
  f.source.placements = "S(0),S(1)";
  f.to_placements = "S(1),S(0)";
  absl::StatusOr<PlanInput> input = BuildPlanInput(f);
  ASSERT_TRUE(input.ok()) << input.status();
  EXPECT_EQ(input->target.RankIds(), input->source.RankIds());
  absl::StatusOr<Plan> plan =
      Redistribute(input->source, input->target, input->dtype, input->options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes_moved, plan->lower_bound_bytes);
  ASSERT_FALSE(plan->steps.empty());
  for (const Step& s : plan->steps) {
    EXPECT_NE(s.op, StepOp::kAllGather);
  }
  EXPECT_TRUE(std::any_of(plan->steps.begin(), plan->steps.end(),
                          [](const Step& s) { return s.op == StepOp::kAllToAll; }));

  const std::string explain = ExplainPlan(*plan);
  EXPECT_THAT(explain, HasSubstr("all_to_all"));
  EXPECT_THAT(explain, Not(HasSubstr("all_gather")));
  const std::string text = PlanText(PlanToProto(*plan, "", ""), /*explain=*/true);
  EXPECT_THAT(text, HasSubstr("all_to_all"));
  EXPECT_THAT(text, Not(HasSubstr("all_gather")));
  EXPECT_THAT(text, HasSubstr("per-rank bytes:\nrank  sent  received\n"));
  const std::string json = PlanJson(*plan);
  EXPECT_THAT(json, HasSubstr("\"op\": \"all_to_all\""));
  EXPECT_THAT(json, Not(HasSubstr("all_gather")));
}

TEST(PlanFormatTest, ExactJsonOfAHandBuiltPlan) {
  v1::Plan p;
  p.set_id("p1");
  p.set_tensor("t");
  v1::Step* s = p.add_steps();
  s->set_op(v1::BROADCAST);
  s->add_ranks(0);
  s->add_ranks(1);
  s->set_root(0);
  s->set_bytes(8);
  s->set_estimated_seconds(0.5);
  v1::Transfer* t = s->add_transfers();
  t->set_src(0);
  t->set_dst(1);
  t->mutable_box()->add_offset(2);
  t->mutable_box()->add_shape(2);
  t->set_bytes(8);
  v1::Step* r = p.add_steps();
  r->set_op(v1::REDUCE_SCATTER);
  r->set_reduce_op(v1::MAX);
  r->add_ranks(1);
  r->add_ranks(0);
  v1::Transfer* rt = r->add_transfers();
  rt->set_src(1);
  rt->set_dst(0);
  rt->mutable_box()->add_offset(0);
  rt->mutable_box()->add_shape(1);
  rt->set_bytes(4);
  rt->set_reduce(true);
  rt->set_partial_index(1);
  v1::LocalCopy* c = p.add_local_copies();
  c->set_rank(0);
  c->mutable_box()->add_offset(0);
  c->mutable_box()->add_shape(2);
  v1::RankTraffic* tr = p.add_traffic();
  tr->set_rank(0);
  tr->set_bytes_sent(8);
  tr->set_bytes_received(4);
  p.set_bytes_moved(12);
  p.set_lower_bound_bytes(12);
  p.set_estimated_seconds(0.5);
  EXPECT_EQ(PlanJson(p),
            "{\"id\": \"p1\", \"tensor\": \"t\", \"steps\": [{\"op\": \"broadcast\", \"ranks\": "
            "[0, 1], \"bytes\": 8, \"transfers\": 1, \"estimated_seconds\": 0.5, \"root\": 0}, "
            "{\"op\": \"reduce_scatter\", \"ranks\": [1, 0], \"bytes\": 0, \"transfers\": 1, "
            "\"estimated_seconds\": 0.0, \"reduce_op\": \"max\"}], \"transfers\": [{\"step\": 0, "
            "\"src\": 0, \"dst\": 1, \"offset\": [2], \"shape\": [2], \"bytes\": 8}, {\"step\": 1, "
            "\"src\": 1, \"dst\": 0, \"offset\": [0], \"shape\": [1], \"bytes\": 4, \"reduce\": "
            "true, \"partial_index\": 1}], \"local_copies\": [{\"rank\": 0, \"offset\": [0], "
            "\"shape\": [2]}], \"traffic\": [{\"rank\": 0, \"bytes_sent\": 8, \"bytes_received\": "
            "4}], \"bytes_moved\": 12, \"lower_bound_bytes\": 12, \"bytes_within_hosts\": 0, "
            "\"bytes_across_hosts\": 0, \"cross_host_lower_bound_bytes\": 0, "
            "\"estimated_seconds\": 0.5}");
  const std::string text = PlanText(p, /*explain=*/false);
  EXPECT_THAT(text, HasSubstr("plan for tensor 't'\n"));
  EXPECT_THAT(text, HasSubstr("bytes moved 12 (12 B), lower bound 12; 2 transfers, 1 local copies; "
                              "estimated 500.00 ms\n"));
  EXPECT_THAT(text, HasSubstr("   0  broadcast (root 0)    [0, 1]          1    8 B  500.00 ms\n"));
  EXPECT_THAT(text, HasSubstr("reduce_scatter (max)"));
  EXPECT_THAT(text, Not(HasSubstr("per-rank")));
}

TEST(PlanFormatTest, TargetDefaultsToTheSource) {
  PlanFlags f;
  f.source.mesh = "2x4";
  f.source.ranks = "7,6,5,4,3,2,1,0";
  f.source.dims = "dp,tp";
  f.source.shape = "8,8";
  f.source.placements = "S(0),S(1)";
  // Same mesh size: ranks and names carry over.
  f.to_placements = "R,S(0)";
  absl::StatusOr<PlanInput> in = BuildPlanInput(f);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->target.mesh()->ranks(), in->source.mesh()->ranks());
  EXPECT_EQ(in->target.mesh()->dim_names(), (std::vector<std::string>{"dp", "tp"}));
  // No target flags: the target is the source; nothing moves.
  f.to_placements.reset();
  in = BuildPlanInput(f);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_TRUE(in->target == in->source);
  absl::StatusOr<Plan> plan = Redistribute(in->source, in->target, in->dtype, in->options);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->bytes_moved, 0);
  // Another mesh size: default ranks 0..n-1; another ndim: unnamed dims.
  f.to_mesh = "4";
  f.to_placements = "S(1)";
  in = BuildPlanInput(f);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->target.mesh()->ranks(), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_TRUE(in->target.mesh()->dim_names().empty());
  // Flat target.
  f.to_placements.reset();
  f.to_flat = "0:16;16:32;32:48;48:64";
  in = BuildPlanInput(f);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_TRUE(in->target.flat_spec().has_value());
}

void ExpectFlagError(const PlanFlags& f, const std::string& prefix) {
  absl::StatusOr<PlanInput> in = BuildPlanInput(f);
  ASSERT_FALSE(in.ok()) << "accepted; want an error starting with " << prefix;
  EXPECT_EQ(in.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(in.status().message()), ::testing::StartsWith(prefix)) << in.status();
}

TEST(PlanFormatTest, ErrorsNameTheFlag) {
  PlanFlags f = IssueExample();
  f.source.placements = "S(0),Q";
  ExpectFlagError(f, "--placements: ");
  f = IssueExample();
  f.to_placements = "S(5)";
  ExpectFlagError(f, "--to-placements: ");
  f = IssueExample();
  f.to_mesh = "4x";
  ExpectFlagError(f, "--to-mesh: ");
  f = IssueExample();
  f.to_ranks = "4,5,6";
  ExpectFlagError(f, "--to-ranks: ");
  f = IssueExample();
  f.to_dims = "a,b";
  ExpectFlagError(f, "--to-dims: ");
  f = IssueExample();
  f.to_flat = "0:1";
  ExpectFlagError(f, "--to-flat: give at most one");
  f = IssueExample();
  f.to_placements.reset();
  f.to_flat = "0:10;;;";
  ExpectFlagError(f, "--to-flat: ");
  f = IssueExample();
  f.hosts = "a,a,a,a,b,b,b";
  ExpectFlagError(f, "--hosts: 7 hosts given (one per global rank from 0), but rank 7");
  f.hosts = "a,,a,a,b,b,b,b";
  ExpectFlagError(f, "--hosts: the host of rank 1 is empty");
  f = IssueExample();
  f.cost = "warp_speed=9";
  ExpectFlagError(f, "--cost: ");
}

TEST(PlanFormatTest, HostsAndCostReachThePlanner) {
  PlanFlags f = IssueExample();
  f.hosts = "h0,h0,h0,h0,h1,h1,h1,h1";
  f.cost = "inter_gbps=1";
  absl::StatusOr<PlanInput> in = BuildPlanInput(f);
  ASSERT_TRUE(in.ok()) << in.status();
  EXPECT_EQ(in->options.hosts_by_rank.size(), 8u);
  EXPECT_EQ(in->options.hosts_by_rank[4], "h1");
  EXPECT_DOUBLE_EQ(in->options.cost.inter_beta_s_per_byte, 1e-9);
  absl::StatusOr<Plan> slow = Redistribute(in->source, in->target, in->dtype, in->options);
  in->options.cost = CostModel();
  absl::StatusOr<Plan> fast = Redistribute(in->source, in->target, in->dtype, in->options);
  ASSERT_TRUE(slow.ok() && fast.ok());
  // Every transfer crosses hosts (ranks 0..3 to 4..7): a slower link costs more.
  EXPECT_GT(slow->estimated_seconds, fast->estimated_seconds);
}

}  // namespace
}  // namespace shardcoord
