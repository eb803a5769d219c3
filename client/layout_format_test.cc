#include "client/layout_format.h"

#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

LayoutFlags Placements(std::string mesh, std::string shape, std::string placements) {
  LayoutFlags f;
  f.mesh = std::move(mesh);
  f.shape = std::move(shape);
  f.placements = std::move(placements);
  return f;
}

LayoutFlags Flat(std::string mesh, std::string shape, std::string flat) {
  LayoutFlags f;
  f.mesh = std::move(mesh);
  f.shape = std::move(shape);
  f.flat = std::move(flat);
  return f;
}

std::string JsonOf(const LayoutFlags& flags) {
  absl::StatusOr<LayoutRequest> r = BuildLayout(flags);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? LayoutJson(r->layout) : "";
}

std::vector<std::string> Lines(const std::string& text) {
  return absl::StrSplit(absl::string_view(text), '\n', absl::SkipEmpty());
}

TEST(ParseTest, MeshShape) {
  EXPECT_THAT(*ParseMeshShape("2x4"), ElementsAre(2, 4));
  EXPECT_THAT(*ParseMeshShape("8"), ElementsAre(8));
  EXPECT_THAT(*ParseMeshShape(" 2x2x2 "), ElementsAre(2, 2, 2));
  for (const char* bad :
       {"", "2x", "x4", "2x0", "2x-1", "2,4", "axb", "2x4x99999999999999999999"}) {
    EXPECT_FALSE(ParseMeshShape(bad).ok()) << bad;
  }
}

TEST(ParseTest, IntList) {
  EXPECT_THAT(*ParseIntList("8,4"), ElementsAre(8, 4));
  EXPECT_THAT(*ParseIntList(" 8 , -4 "), ElementsAre(8, -4));
  EXPECT_TRUE(ParseIntList("").value().empty());
  EXPECT_TRUE(ParseIntList("  ").value().empty());
  for (const char* bad : {"8,,4", "8,", "a", "1.5", "99999999999999999999"}) {
    absl::StatusOr<std::vector<int64_t>> r = ParseIntList(bad);
    EXPECT_FALSE(r.ok()) << bad;
  }
  EXPECT_THAT(std::string(ParseIntList("8,x").status().message()),
              HasSubstr("'x' is not an integer"));
}

TEST(ParseTest, NameList) {
  EXPECT_THAT(ParseNameList("dp, tp"), ElementsAre("dp", "tp"));
  EXPECT_TRUE(ParseNameList("").empty());
}

TEST(BuildMeshTest, RanksAndDimNames) {
  LayoutFlags f;
  f.mesh = "2x2";
  f.ranks = "3,2,1,0";
  f.dims = "dp,tp";
  absl::StatusOr<DeviceMesh> mesh = BuildMesh(f);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_THAT(mesh->ranks(), ElementsAre(3, 2, 1, 0));
  EXPECT_THAT(mesh->dim_names(), ElementsAre("dp", "tp"));
}

// The seed examples of the foundation issue, exactly.
TEST(LayoutJsonTest, SeedMesh2x4NestedShard) {
  EXPECT_EQ(JsonOf(Placements("2x4", "8,4", "S(0),S(0)")),
            "{\"chunks\": ["
            "{\"rank\": 0, \"coord\": [0, 0], \"offset\": [0, 0], \"shape\": [1, 4]}, "
            "{\"rank\": 1, \"coord\": [0, 1], \"offset\": [1, 0], \"shape\": [1, 4]}, "
            "{\"rank\": 2, \"coord\": [0, 2], \"offset\": [2, 0], \"shape\": [1, 4]}, "
            "{\"rank\": 3, \"coord\": [0, 3], \"offset\": [3, 0], \"shape\": [1, 4]}, "
            "{\"rank\": 4, \"coord\": [1, 0], \"offset\": [4, 0], \"shape\": [1, 4]}, "
            "{\"rank\": 5, \"coord\": [1, 1], \"offset\": [5, 0], \"shape\": [1, 4]}, "
            "{\"rank\": 6, \"coord\": [1, 2], \"offset\": [6, 0], \"shape\": [1, 4]}, "
            "{\"rank\": 7, \"coord\": [1, 3], \"offset\": [7, 0], \"shape\": [1, 4]}]}");
}

TEST(LayoutJsonTest, SeedMoreRanksThanElements) {
  EXPECT_EQ(JsonOf(Placements("8", "2", "S(0)")),
            "{\"chunks\": ["
            "{\"rank\": 0, \"coord\": [0], \"offset\": [0], \"shape\": [1]}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [1], \"shape\": [1]}, "
            "{\"rank\": 2, \"coord\": [2], \"offset\": [2], \"shape\": [0]}, "
            "{\"rank\": 3, \"coord\": [3], \"offset\": [2], \"shape\": [0]}, "
            "{\"rank\": 4, \"coord\": [4], \"offset\": [2], \"shape\": [0]}, "
            "{\"rank\": 5, \"coord\": [5], \"offset\": [2], \"shape\": [0]}, "
            "{\"rank\": 6, \"coord\": [6], \"offset\": [2], \"shape\": [0]}, "
            "{\"rank\": 7, \"coord\": [7], \"offset\": [2], \"shape\": [0]}]}");
}

TEST(LayoutJsonTest, SeedFlatRangesWithEmptyRanks) {
  // 0:4 is row 0 cols 0..3; 20:30 rows 4..5; 4:20 is (0,4) then rows 1..3. Ranks 2 and 3 hold
  // nothing and still appear, with offset and shape all 0.
  EXPECT_EQ(JsonOf(Flat("4", "6,5", "0:4,20:30;4:20;;")),
            "{\"chunks\": ["
            "{\"rank\": 0, \"coord\": [0], \"offset\": [0, 0], \"shape\": [1, 4], "
            "\"local_offset\": 0}, "
            "{\"rank\": 0, \"coord\": [0], \"offset\": [4, 0], \"shape\": [2, 5], "
            "\"local_offset\": 4}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [0, 4], \"shape\": [1, 1], "
            "\"local_offset\": 0}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [1, 0], \"shape\": [3, 5], "
            "\"local_offset\": 1}, "
            "{\"rank\": 2, \"coord\": [2], \"offset\": [0, 0], \"shape\": [0, 0], "
            "\"local_offset\": 0}, "
            "{\"rank\": 3, \"coord\": [3], \"offset\": [0, 0], \"shape\": [0, 0], "
            "\"local_offset\": 0}]}");
}

TEST(LayoutJsonTest, FlatWithOneBoxPerRankHasNoLocalOffsets) {
  EXPECT_EQ(JsonOf(Flat("2", "2,3", "0:3;3:6")),
            "{\"chunks\": ["
            "{\"rank\": 0, \"coord\": [0], \"offset\": [0, 0], \"shape\": [1, 3]}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [1, 0], \"shape\": [1, 3]}]}");
}

TEST(LayoutJsonTest, UnevenExplicitSizes) {
  EXPECT_EQ(JsonOf(Placements("2", "8,2", "S(0,[3,5])")),
            "{\"chunks\": ["
            "{\"rank\": 0, \"coord\": [0], \"offset\": [0, 0], \"shape\": [3, 2]}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [3, 0], \"shape\": [5, 2]}]}");
  // A zero size is an empty shard at the end of what precedes it.
  EXPECT_EQ(JsonOf(Placements("3", "8", "S(0,[0,8,0])")),
            "{\"chunks\": ["
            "{\"rank\": 0, \"coord\": [0], \"offset\": [0], \"shape\": [0]}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [0], \"shape\": [8]}, "
            "{\"rank\": 2, \"coord\": [2], \"offset\": [8], \"shape\": [0]}]}");
}

TEST(LayoutJsonTest, TorchChunkLeavesTrailingShardsSmallerOrEmpty) {
  // torch.chunk(5 rows, 4) gives 2,2,1,0.
  EXPECT_EQ(JsonOf(Placements("4", "5", "S(-1)")),
            "{\"chunks\": ["
            "{\"rank\": 0, \"coord\": [0], \"offset\": [0], \"shape\": [2]}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [2], \"shape\": [2]}, "
            "{\"rank\": 2, \"coord\": [2], \"offset\": [4], \"shape\": [1]}, "
            "{\"rank\": 3, \"coord\": [3], \"offset\": [5], \"shape\": [0]}]}");
}

TEST(LayoutJsonTest, PermutedRanksKeepMeshOrderAndCoordinates) {
  LayoutFlags f = Placements("2x2", "4,4", "S(0),S(1)");
  f.ranks = "3,2,1,0";
  EXPECT_EQ(JsonOf(f),
            "{\"chunks\": ["
            "{\"rank\": 3, \"coord\": [0, 0], \"offset\": [0, 0], \"shape\": [2, 2]}, "
            "{\"rank\": 2, \"coord\": [0, 1], \"offset\": [0, 2], \"shape\": [2, 2]}, "
            "{\"rank\": 1, \"coord\": [1, 0], \"offset\": [2, 0], \"shape\": [2, 2]}, "
            "{\"rank\": 0, \"coord\": [1, 1], \"offset\": [2, 2], \"shape\": [2, 2]}]}");
}

TEST(LayoutJsonTest, PartialLayoutsAddPartialIndex) {
  EXPECT_EQ(JsonOf(Placements("2x2", "4", "P(sum),S(0)")),
            "{\"chunks\": ["
            "{\"rank\": 0, \"coord\": [0, 0], \"offset\": [0], \"shape\": [2], "
            "\"partial_index\": 0}, "
            "{\"rank\": 1, \"coord\": [0, 1], \"offset\": [2], \"shape\": [2], "
            "\"partial_index\": 0}, "
            "{\"rank\": 2, \"coord\": [1, 0], \"offset\": [0], \"shape\": [2], "
            "\"partial_index\": 1}, "
            "{\"rank\": 3, \"coord\": [1, 1], \"offset\": [2], \"shape\": [2], "
            "\"partial_index\": 1}]}");
}

struct BadCase {
  LayoutFlags flags;
  const char* prefix;
  const char* detail;
};

TEST(BuildLayoutTest, ErrorsNameTheFlagOnOneLine) {
  LayoutFlags wrong_rank_count = Placements("2x4", "8,4", "S(0),S(0)");
  wrong_rank_count.ranks = "0,1,2,3,4,5,6";
  LayoutFlags duplicate_rank = Placements("2", "8", "S(0)");
  duplicate_rank.ranks = "1,1";
  LayoutFlags bad_rank = Placements("2", "8", "S(0)");
  bad_rank.ranks = "0,one";
  LayoutFlags negative_rank = Placements("2", "8", "S(0)");
  negative_rank.ranks = "0,-1";
  LayoutFlags wrong_dim_names = Placements("2x4", "8,4", "S(0),S(0)");
  wrong_dim_names.dims = "dp";
  LayoutFlags bad_dtype = Placements("2", "8", "S(0)");
  bad_dtype.dtype = "f33";
  LayoutFlags byte_overflow = Placements("2", "4294967296,1073741824", "S(0)");
  byte_overflow.dtype = "f64";
  LayoutFlags both = Placements("2", "8", "S(0)");
  both.flat = "0:4;4:8";
  LayoutFlags neither;
  neither.mesh = "2";
  neither.shape = "8";

  const std::vector<BadCase> cases = {
      {Placements("2x4", "8,4", "S(3),S(0)"), "--placements: ", "S(3)"},
      {Placements("2", "8,4", "S(0,[3,4])"), "--placements: ", "sizes sum to 7"},
      {Placements("2", "8", "S(0,[8])"), "--placements: ", "1 sizes"},
      {Placements("2x2", "8", "S(0)"), "--placements: ", "1 items"},
      {Placements("2", "8", "X(0)"), "--placements: ", "unknown placement"},
      {Placements("2", "8", ""), "--placements: ", "empty"},
      {Placements("2x2", "8", "P(sum),P(max)"), "--placements: ", "mix"},
      {wrong_rank_count, "--ranks: ", "8 positions but 7 ranks"},
      {duplicate_rank, "--ranks: ", "appears twice"},
      {bad_rank, "--ranks: ", "'one'"},
      {negative_rank, "--ranks: ", "negative"},
      {wrong_dim_names, "--dims: ", "1 dim names"},
      {Placements("2x0", "8", "S(0)"), "--mesh: ", "'0'"},
      {Placements("", "8", "S(0)"), "--mesh: ", "empty"},
      {Placements("2048x1024", "8", "S(0),R"), "--mesh: ", "2097152 positions"},
      {Placements("2", "4294967296,4294967296", "S(0)"), "--shape: ", "overflows"},
      {byte_overflow, "--shape: ", "byte size"},
      {Placements("2", "8,-1", "S(0)"), "--shape: ", "negative"},
      {Placements("2", "8,x", "S(0)"), "--shape: ", "'x'"},
      {bad_dtype, "--dtype: ", "f33"},
      {Flat("2", "6,5", "0:10;5:30"), "--flat: ", "overlaps"},
      {Flat("2", "6,5", "0:10;15:30"), "--flat: ", "cover 25 of the 30"},
      {Flat("2", "6,5", "0:10;10:31"), "--flat: ", "outside"},
      {Flat("2", "6,5", "0:10;10:30;"), "--flat: ", "3 rank groups"},
      {Flat("2", "6,5", "0:a;10:30"), "--flat: ", "not start:end"},
      {Flat("2", "6,5", "9:3;0:30"), "--flat: ", "start <= end"},
      {both, "--flat: ", "exactly one"},
      {neither, "--placements: ", "exactly one"},
  };
  for (const BadCase& c : cases) {
    absl::StatusOr<LayoutRequest> r = BuildLayout(c.flags);
    ASSERT_FALSE(r.ok()) << c.prefix << c.detail;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string message(r.status().message());
    EXPECT_THAT(message, StartsWith(c.prefix));
    EXPECT_THAT(message, HasSubstr(c.detail)) << c.prefix;
    EXPECT_EQ(message.find('\n'), std::string::npos);
  }
}

TEST(LayoutTableTest, SeedTableRowsAndSummary) {
  LayoutFlags f = Placements("2x4", "8,4", "S(0),S(0)");
  f.dims = "dp,tp";
  absl::StatusOr<LayoutRequest> r = BuildLayout(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(LayoutTable(r->layout, r->dtype),
            "tensor [8, 4] f32, 128 bytes\n"
            "layout S(0),S(0) on mesh 2x4 (dp, tp) ranks [0,1,2,3,4,5,6,7]\n"
            "\n"
            "rank  coord   offset  shape   bytes\n"
            "   0  [0, 0]  [0, 0]  [1, 4]     16\n"
            "   1  [0, 1]  [1, 0]  [1, 4]     16\n"
            "   2  [0, 2]  [2, 0]  [1, 4]     16\n"
            "   3  [0, 3]  [3, 0]  [1, 4]     16\n"
            "   4  [1, 0]  [4, 0]  [1, 4]     16\n"
            "   5  [1, 1]  [5, 0]  [1, 4]     16\n"
            "   6  [1, 2]  [6, 0]  [1, 4]     16\n"
            "   7  [1, 3]  [7, 0]  [1, 4]     16\n"
            "\n"
            "held: 128 bytes in total (1x the tensor), at most 16 bytes on one rank\n");
}

TEST(LayoutTableTest, FlatShowsLocalOffsetsAndEmptyRanks) {
  LayoutFlags f = Flat("4", "6,5", "0:4,20:30;4:20;;");
  f.dtype = "bf16";
  absl::StatusOr<LayoutRequest> r = BuildLayout(f);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(LayoutTable(r->layout, r->dtype),
            "tensor [6, 5] bf16, 60 bytes\n"
            "layout flat '0:4,20:30;4:20;;' on mesh 4 ranks [0,1,2,3]\n"
            "\n"
            "rank  coord  offset  shape   bytes  local offset\n"
            "   0  [0]    [0, 0]  [1, 4]      8             0\n"
            "   0  [0]    [4, 0]  [2, 5]     20             4\n"
            "   1  [1]    [0, 4]  [1, 1]      2             0\n"
            "   1  [1]    [1, 0]  [3, 5]     30             1\n"
            "   2  [2]    -       -           0             -\n"
            "   3  [3]    -       -           0             -\n"
            "\n"
            "held: 60 bytes in total (1x the tensor), at most 32 bytes on one rank\n");
}

TEST(LayoutTableTest, ReplicasAndPartials) {
  absl::StatusOr<LayoutRequest> r = BuildLayout(Placements("2x2", "4", "P(avg),R"));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string table = LayoutTable(r->layout, r->dtype);
  EXPECT_THAT(table, HasSubstr("partial: 2 contributions (partial index) reduce with avg\n"));
  EXPECT_THAT(table, HasSubstr("rank  coord   offset  shape  bytes  partial\n"));
  EXPECT_THAT(table, HasSubstr("   3  [1, 1]  [0]     [4]       16        1\n"));
  EXPECT_THAT(table, HasSubstr("held: 64 bytes in total (4x the tensor)"));
}

TEST(LayoutPictureTest, SeedPicture) {
  absl::StatusOr<LayoutRequest> r = BuildLayout(Placements("2x4", "8,4", "S(0),S(0)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(LayoutPicture(r->layout),
            "picture: rows are dim 0 (8 in 8 cells), columns are dim 1 (4 in 4 cells); each "
            "cell is one element\n"
            "  0 0 0 0\n"
            "  1 1 1 1\n"
            "  2 2 2 2\n"
            "  3 3 3 3\n"
            "  4 4 4 4\n"
            "  5 5 5 5\n"
            "  6 6 6 6\n"
            "  7 7 7 7\n");
}

TEST(LayoutPictureTest, FlatPicture) {
  absl::StatusOr<LayoutRequest> r = BuildLayout(Flat("4", "6,5", "0:4,20:30;4:20;;"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(
      Lines(LayoutPicture(r->layout)),
      ElementsAre(StartsWith("picture: rows are dim 0 (6 in 6 cells)"), "  0 0 0 0 1",
                  "  1 1 1 1 1", "  1 1 1 1 1", "  1 1 1 1 1", "  0 0 0 0 0", "  0 0 0 0 0"));
}

TEST(LayoutPictureTest, OneDimWithReplicasAndEmptyShards) {
  absl::StatusOr<LayoutRequest> r = BuildLayout(Placements("2x4", "3", "R,S(0)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(LayoutPicture(r->layout),
            "picture: dim 0 (3 in 3 cells); each cell is one element\n"
            "  0,4 1,5 2,6\n");
}

TEST(LayoutPictureTest, ConsecutiveReplicasAreShortened) {
  absl::StatusOr<LayoutRequest> r = BuildLayout(Placements("2x4", "2,2", "S(0),R"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Lines(LayoutPicture(r->layout)),
              ElementsAre(StartsWith("picture:"), "  0-3 0-3", "  4-7 4-7"));
}

TEST(LayoutPictureTest, LongRankListsBecomeLegendKeys) {
  // Replicas along dim 0 of an 8x2 mesh are every other rank: 0,2,...,14 and 1,3,...,15.
  absl::StatusOr<LayoutRequest> r = BuildLayout(Placements("8x2", "4", "R,S(0)"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(Lines(LayoutPicture(r->layout)),
              ElementsAre(StartsWith("picture:"), "  g1 g1 g2 g2",
                          "  g1 = ranks 0,2,4,6,8,10,12,14", "  g2 = ranks 1,3,5,7,9,11,13,15"));
}

TEST(LayoutPictureTest, LargeTensorsAreScaledDown) {
  absl::StatusOr<LayoutRequest> r = BuildLayout(Placements("2x2", "1000,300", "R,S(1)"));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<std::string> lines = Lines(LayoutPicture(r->layout));
  ASSERT_EQ(lines.size(), 1 + kPictureMaxRows);
  EXPECT_THAT(lines[0], HasSubstr("1000 in 32 cells"));
  EXPECT_THAT(lines[0], HasSubstr("300 in 16 cells"));
  EXPECT_THAT(lines[0], HasSubstr("up to 32x19 elements"));
  for (size_t i = 1; i < lines.size(); ++i) {
    // 16 cells of "0,2" / "1,3": the two column halves.
    EXPECT_EQ(lines[i], "  0,2 0,2 0,2 0,2 0,2 0,2 0,2 0,2 1,3 1,3 1,3 1,3 1,3 1,3 1,3 1,3");
    EXPECT_LE(lines[i].size(), 2 + kPictureMaxWidth);
  }
}

TEST(LayoutPictureTest, WideOneDimTensorFitsTheWidth) {
  // 1000 ranks with two-to-three digit labels over a 1-d tensor.
  absl::StatusOr<LayoutRequest> r = BuildLayout(Placements("1000", "100000", "S(0)"));
  ASSERT_TRUE(r.ok()) << r.status();
  const std::vector<std::string> lines = Lines(LayoutPicture(r->layout));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_LE(lines[1].size(), 2 + kPictureMaxWidth);
  EXPECT_THAT(lines[1], StartsWith("    0"));
}

TEST(LayoutPictureTest, NothingForEmptyOrHigherRankTensors) {
  absl::StatusOr<LayoutRequest> empty = BuildLayout(Placements("2", "0,4", "S(1)"));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(LayoutPicture(empty->layout), "picture: the tensor is empty, nothing to draw\n");
  absl::StatusOr<LayoutRequest> cube = BuildLayout(Placements("2", "2,2,2", "S(2)"));
  ASSERT_TRUE(cube.ok()) << cube.status();
  EXPECT_EQ(LayoutPicture(cube->layout), "");
  absl::StatusOr<LayoutRequest> scalar = BuildLayout(Placements("2", "", "R"));
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(LayoutPicture(scalar->layout), "");
  EXPECT_EQ(LayoutJson(scalar->layout),
            "{\"chunks\": [{\"rank\": 0, \"coord\": [0], \"offset\": [], \"shape\": []}, "
            "{\"rank\": 1, \"coord\": [1], \"offset\": [], \"shape\": []}]}");
}

}  // namespace
}  // namespace shardcoord
