#include "coordinator/http/layout_svg.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/mesh.h"
#include "sharding/placement.h"

namespace shardcoord {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

Layout FromText(Shape mesh_shape, const Shape& shape, const std::string& placements) {
  absl::StatusOr<DeviceMesh> mesh = DeviceMesh::Create(std::move(mesh_shape), {});
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  absl::StatusOr<std::vector<Placement>> p = ParsePlacements(placements);
  EXPECT_TRUE(p.ok()) << p.status();
  absl::StatusOr<Layout> layout = Layout::FromPlacements(*mesh, shape, *p);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t i = text.find(what); i != std::string::npos; i = text.find(what, i + 1)) ++n;
  return n;
}

TEST(LayoutSvgTest, OneBlockPerDistinctBoxLabelledWithItsHolders) {
  // S(0),R on 2x2: rows [0,32) on ranks 0,1 and [32,64) on ranks 2,3.
  const std::string svg = LayoutSvg(FromText({2, 2}, {64, 48}, "S(0),R"), "w <v3>");
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u) << svg;
  EXPECT_EQ(Count(svg, "<g class=\"block\""), 2) << svg;
  EXPECT_THAT(svg, HasSubstr("<title>ranks 0,1: rows [0, 32), columns [0, 48)</title>"));
  EXPECT_THAT(svg, HasSubstr("<title>ranks 2,3: rows [32, 64), columns [0, 48)</title>"));
  EXPECT_THAT(svg, HasSubstr(">w &lt;v3&gt;</text>"));  // The title, escaped.
  EXPECT_THAT(svg, HasSubstr("rows: dim 0 (64), columns: dim 1 (48)"));
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
}

TEST(LayoutSvgTest, ShardsAlongColumnsAndRanges) {
  const std::string svg = LayoutSvg(FromText({4}, {8, 40}, "S(1)"), "t");
  EXPECT_EQ(Count(svg, "<g class=\"block\""), 4);
  for (int r = 0; r < 4; ++r) {
    EXPECT_THAT(svg, HasSubstr(absl::StrCat("data-ranks=\"", r, "\"")));
  }
  EXPECT_THAT(svg, HasSubstr("columns [30, 40)"));
  // Fully replicated on 4 ranks: one block, "0-3".
  EXPECT_THAT(LayoutSvg(FromText({4}, {8, 40}, "R"), "t"), HasSubstr("data-ranks=\"0-3\""));
}

TEST(LayoutSvgTest, OneDimAndHigherDims) {
  const std::string one = LayoutSvg(FromText({2}, {10}, "S(0)"), "v");
  EXPECT_THAT(one, HasSubstr("dim 0 (10)"));
  EXPECT_THAT(one, HasSubstr("<title>rank 1: [5, 10)</title>"));
  const std::string three = LayoutSvg(FromText({2}, {4, 6, 8}, "S(1)"), "x");
  EXPECT_THAT(three, HasSubstr("dims 1..1 projected away"));
  // Shards of dim 1 project onto the same rows and columns: one block held by both.
  EXPECT_EQ(Count(three, "<g class=\"block\""), 1);
  EXPECT_THAT(three, HasSubstr("data-ranks=\"0,1\""));
}

TEST(LayoutSvgTest, EmptyChunksAreNotDrawn) {
  // 3 rows on 4 ranks: the last shard is empty.
  const std::string svg = LayoutSvg(FromText({4}, {3, 2}, "S(0)"), "e");
  EXPECT_EQ(Count(svg, "<g class=\"block\""), 3);
  EXPECT_THAT(svg, Not(HasSubstr("data-ranks=\"3\"")));
}

}  // namespace
}  // namespace shardcoord
