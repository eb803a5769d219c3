#include "worker/plans/fragment.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/convert.h"
#include "sharding/layout.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"
#include "sharding/plan_fragment.h"
#include "sharding/planner.h"

namespace shardcoord {
namespace {

Plan MakePlan(const std::string& from, const std::string& to) {
  DeviceMesh mesh = *DeviceMesh::Create({4});
  Layout a = *Layout::FromPlacements(mesh, {8, 8}, *ParsePlacements(from));
  Layout b = *Layout::FromPlacements(mesh, {8, 8}, *ParsePlacements(to));
  absl::StatusOr<Plan> plan = Redistribute(a, b, DType::kF32);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *plan;
}

FragmentMemberOptions MemberT(int32_t index = 0) {
  FragmentMemberOptions member;
  member.index = index;
  member.plan_id = "p";
  member.tensor = "T";
  member.source_version = 1;
  member.target_version = 2;
  return member;
}

// What `rank` does in `plans` (fused: a transaction of them, one member each).
v1::PlanFragment FragmentFor(std::vector<const Plan*> plans, int64_t rank, bool fused) {
  FragmentOptions options;
  options.plan_id = fused ? "g" : "p";
  options.fused = fused;
  options.incarnations = {{0, 1}, {1, 1}, {2, 1}, {3, 1}};
  options.communicator_prefix = "plan/p/";
  std::vector<FragmentMemberOptions> members;
  for (size_t i = 0; i < plans.size(); ++i) members.push_back(MemberT(static_cast<int32_t>(i)));
  return FragmentToProto(MakeFragments(plans, members, options).at(rank));
}

v1::PlanFragment FragmentFor(const Plan& plan, int64_t rank) {
  return FragmentFor({&plan}, rank, false);
}

void ExpectBad(const v1::PlanFragment& f, const std::string& needle) {
  absl::StatusOr<Fragment> parsed = ParseFragment(f);
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << parsed.status();
  EXPECT_NE(parsed.status().message().find(needle), std::string::npos) << parsed.status();
}

TEST(FragmentTest, PlannerFragmentsAreValid) {
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"S(0)", "S(1)"},
                                 {"S(0)", "R"},
                                 {"R", "S(1)"},
                                 {"P(sum)", "R"},
                                 {"P(sum)", "S(0)"},
                                 {"S(1)", "P(sum)"}}) {
    Plan plan = MakePlan(from, to);
    for (int64_t r = 0; r < 4; ++r) {
      absl::StatusOr<Fragment> f = ParseFragment(FragmentFor(plan, r));
      EXPECT_TRUE(f.ok()) << from << " -> " << to << " rank " << r << ": " << f.status();
    }
  }
}

TEST(FragmentTest, NamesBadTransferBytes) {
  v1::PlanFragment f = FragmentFor(MakePlan("S(0)", "S(1)"), 1);
  ASSERT_GT(f.steps_size(), 0);
  ASSERT_GT(f.steps(0).transfers_size(), 0);
  f.mutable_steps(0)->mutable_transfers(0)->set_bytes(3);
  ExpectBad(f, "steps[0].transfers[0]: bytes 3");
}

// Found with worker:fragment_fuzz's sanitizers: 2^62 f64 elements are 2^65 bytes, which wrapped
// to 0 and matched a transfer declaring 0 bytes.
TEST(FragmentTest, RejectsTransferBytesOverflowingInt64) {
  v1::PlanFragment f = FragmentFor(MakePlan("S(0)", "S(1)"), 1);
  f.set_dtype(v1::F64);
  v1::Transfer* t = f.mutable_steps(0)->mutable_transfers(0);
  t->mutable_box()->set_shape(0, int64_t{1} << 62);
  t->mutable_box()->set_shape(1, 1);
  t->set_bytes(0);
  ExpectBad(f, "steps[0].transfers[0]: the byte size of shape");
}

// Rank 1's fragment of S(0) -> S(1) with the box of its first step-0 transfer that rank 1
// sends (else receives) moved to `offset` along `dim`: refused with `message`.
void ExpectBadMovedTransfer(bool sent, int dim, int64_t offset, const std::string& message) {
  v1::PlanFragment f = FragmentFor(MakePlan("S(0)", "S(1)"), 1);
  for (int j = 0; j < f.steps(0).transfers_size(); ++j) {
    v1::Transfer* t = f.mutable_steps(0)->mutable_transfers(j);
    if ((sent ? t->src() : t->dst()) != 1) continue;
    t->mutable_box()->set_offset(dim, offset);
    ExpectBad(f, message);
    return;
  }
  FAIL() << (sent ? "rank 1 sends nothing" : "rank 1 receives nothing");
}

TEST(FragmentTest, NamesSendOutsideSourceChunk) {
  // Rank 1 holds rows 2..3 only.
  ExpectBadMovedTransfer(/*sent=*/true, 0, 0, "lies in no source chunk of rank 1");
}

TEST(FragmentTest, NamesReceiveOutsideTargetChunk) {
  // Rank 1 gets columns 2..3 only.
  ExpectBadMovedTransfer(/*sent=*/false, 1, 6, "lies in no target chunk of rank 1");
}

TEST(FragmentTest, NamesLocalCopyOutsideChunks) {
  v1::PlanFragment f = FragmentFor(MakePlan("S(0)", "S(1)"), 2);
  ASSERT_EQ(f.local_copies_size(), 1);
  f.mutable_local_copies(0)->mutable_box()->set_offset(0, 0);
  ExpectBad(f, "local_copies[0]: box");
}

TEST(FragmentTest, NamesMissingIncarnation) {
  v1::PlanFragment f = FragmentFor(MakePlan("S(0)", "S(1)"), 0);
  f.clear_member_ranks();
  f.clear_member_incarnations();
  ExpectBad(f, "steps[0]: member rank");
}

TEST(FragmentTest, WireErrorsComeFromConvert) {
  v1::PlanFragment f = FragmentFor(MakePlan("S(0)", "S(1)"), 0);
  f.set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectBad(f, "dtype");
}

TEST(FragmentTest, PartialSourceMatchesContribution) {
  Plan plan = MakePlan("P(sum)", "R");
  absl::StatusOr<Fragment> f = ParseFragment(FragmentFor(plan, 1));
  ASSERT_TRUE(f.ok()) << f.status();
  const FragmentShape& shape = f->shapes[0];
  EXPECT_TRUE(SourceIsPartial(shape));
  ASSERT_EQ(shape.source.chunks.size(), 1u);
  const Chunk& c = shape.source.chunks[0];
  EXPECT_EQ(FindContainingChunk(shape.source, c.box, true, c.partial_index), 0);
  EXPECT_EQ(FindContainingChunk(shape.source, c.box, true, c.partial_index + 1), -1);
  EXPECT_EQ(FindContainingChunk(shape.source, c.box, false, 99), 0);
}

TEST(FragmentTest, FusedFragmentsParseToo) {
  const Plan a = MakePlan("S(0)", "S(1)");
  const Plan b = MakePlan("R", "S(0)");
  for (int64_t r = 0; r < 4; ++r) {
    absl::StatusOr<Fragment> f = ParseFragment(FragmentFor({&a, &b, &a}, r, true));
    ASSERT_TRUE(f.ok()) << "rank " << r << ": " << f.status();
    EXPECT_TRUE(f->fused);
    EXPECT_EQ(f->shapes.size(), 2u);
    EXPECT_EQ(f->members.size(), 3u);
  }
}

TEST(FragmentTest, NamesTheShapeOfAFusedFragment) {
  const Plan a = MakePlan("S(0)", "S(1)");
  v1::PlanFragment f = FragmentFor({&a}, 1, true);
  ASSERT_EQ(f.shapes_size(), 1);
  ASSERT_GT(f.shapes(0).transfers_size(), 0);
  f.mutable_shapes(0)->mutable_transfers(0)->set_bytes(3);
  ExpectBad(f, "shapes[0].transfers[0]: bytes 3");
}

}  // namespace
}  // namespace shardcoord
