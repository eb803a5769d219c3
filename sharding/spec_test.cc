#include "sharding/spec.h"

#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::ErrorOf;
using sharding_testing::Mesh;
using ::testing::HasSubstr;

TEST(SpecTest, LayoutForSpecChecksPlacementsAgainstTensorAndMesh) {
  const DeviceMesh mesh = Mesh({2, 2});
  Spec spec;
  spec.placements = {Placement::Replicate(), Placement::Shard(3)};
  EXPECT_EQ(ErrorOf(LayoutForSpec(spec, mesh, {8, 4})), "spec.placements[1]: S(3) on a 2-d tensor");

  spec.placements = {Placement::Shard(0)};
  EXPECT_EQ(ErrorOf(LayoutForSpec(spec, mesh, {8, 4})),
            "spec.placements: 'S(0)' has 1 items but mesh 2x2 has 2 dims");

  spec.placements = {Placement::Shard(0, {1, 2, 5}), Placement::Replicate()};
  EXPECT_EQ(ErrorOf(LayoutForSpec(spec, mesh, {8, 4})),
            "spec.placements[0]: S(0,[1,2,5]) has 3 sizes but mesh dim 0 has 2 positions");

  spec.placements = {Placement::Shard(0, {1, 2}), Placement::Replicate()};
  EXPECT_THAT(ErrorOf(LayoutForSpec(spec, mesh, {8, 4})),
              HasSubstr("spec.placements: placement S(0,[1,2]) at mesh dim 0: sizes sum to 3"));

  spec.placements = {Placement::Partial(ReduceOp::kSum), Placement::Partial(ReduceOp::kMax)};
  EXPECT_EQ(ErrorOf(LayoutForSpec(spec, mesh, {8, 4})),
            "spec.placements[1]: P(max) after P(sum): all Partial dims must use one reduce op");

  spec.placements = {Placement::Shard(-1), Placement::Shard(0)};
  absl::StatusOr<Layout> layout = LayoutForSpec(spec, mesh, {8, 4});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(*layout, *Layout::FromPlacements(mesh, {8, 4}, spec.placements));

  Spec flat;
  flat.is_flat = true;
  flat.flat = {{{0, 16}}, {{16, 32}}};
  EXPECT_EQ(ErrorOf(LayoutForSpec(flat, mesh, {8, 4}, "target")),
            "target.flat: 2 ranks given for mesh 2x2 of 4 ranks");
  flat.flat = {{{0, 8}}, {{8, 16}}, {{16, 24}}, {{24, 40}}};
  EXPECT_THAT(ErrorOf(LayoutForSpec(flat, mesh, {8, 4})), HasSubstr("spec.flat: "));
}

TEST(SpecTest, ToStringShowsPlacementsOrFlat) {
  Spec spec;
  spec.placements = {Placement::Shard(0), Placement::Replicate()};
  EXPECT_EQ(spec.ToString(), "S(0),R");
}

}  // namespace
}  // namespace shardcoord
