#include "sharding/placement.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardcoord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<Placement> MustParse(const std::string& text) {
  absl::StatusOr<std::vector<Placement>> p = ParsePlacements(text);
  EXPECT_TRUE(p.ok()) << text << ": " << p.status();
  return p.ok() ? *std::move(p) : std::vector<Placement>{};
}

void ExpectRejected(const std::string& text, const std::string& needle) {
  absl::StatusOr<std::vector<Placement>> p = ParsePlacements(text);
  ASSERT_FALSE(p.ok()) << "'" << text << "' was accepted";
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_THAT(std::string(p.status().message()), HasSubstr(needle)) << text;
}

TEST(ReduceOpTest, NamesRoundTrip) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax}) {
    EXPECT_EQ(*ParseReduceOp(ReduceOpName(op)), op);
  }
  EXPECT_EQ(*ParseReduceOp(" MEAN "), ReduceOp::kAvg);
  EXPECT_EQ(ParseReduceOp("prod").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(ParseReduceOp("prod").status().message()), HasSubstr("'prod'"));
}

TEST(ParsePlacementsTest, ShortForms) {
  EXPECT_THAT(MustParse("S(0),S(0)"), ElementsAre(Placement::Shard(0), Placement::Shard(0)));
  EXPECT_THAT(MustParse("S(-1)"), ElementsAre(Placement::Shard(-1)));
  EXPECT_THAT(MustParse("S(0,[3,5])"), ElementsAre(Placement::Shard(0, {3, 5})));
  EXPECT_THAT(MustParse("R"), ElementsAre(Placement::Replicate()));
  EXPECT_THAT(MustParse("P(sum)"), ElementsAre(Placement::Partial(ReduceOp::kSum)));
  EXPECT_THAT(MustParse("P(avg)"), ElementsAre(Placement::Partial(ReduceOp::kAvg)));
  EXPECT_THAT(MustParse("P"), ElementsAre(Placement::Partial(ReduceOp::kSum)));
}

TEST(ParsePlacementsTest, LongForms) {
  EXPECT_THAT(MustParse("Shard(1)"), ElementsAre(Placement::Shard(1)));
  EXPECT_THAT(MustParse("Replicate"), ElementsAre(Placement::Replicate()));
  EXPECT_THAT(MustParse("Replicate()"), ElementsAre(Placement::Replicate()));
  EXPECT_THAT(MustParse("Partial(max)"), ElementsAre(Placement::Partial(ReduceOp::kMax)));
  EXPECT_THAT(MustParse("Partial(min)"), ElementsAre(Placement::Partial(ReduceOp::kMin)));
}

TEST(ParsePlacementsTest, FieldsOfParsedItems) {
  std::vector<Placement> p = MustParse(" Shard(1) , S( 0 , [ 3 , 0 , 5 ] ), R, Partial(avg) ");
  ASSERT_EQ(p.size(), 4u);
  EXPECT_TRUE(p[0].is_shard());
  EXPECT_EQ(p[0].dim, 1);
  EXPECT_TRUE(p[0].sizes.empty());
  EXPECT_TRUE(p[1].is_shard());
  EXPECT_EQ(p[1].dim, 0);
  EXPECT_THAT(p[1].sizes, ElementsAre(3, 0, 5));
  EXPECT_TRUE(p[2].is_replicate());
  EXPECT_TRUE(p[3].is_partial());
  EXPECT_EQ(p[3].op, ReduceOp::kAvg);
}

TEST(ParsePlacementsTest, RejectionsNameTheProblem) {
  ExpectRejected("", "empty");
  ExpectRejected("   ", "empty");
  ExpectRejected("S(0),", "empty item");
  ExpectRejected("S(0),,R", "empty item");
  ExpectRejected("S", "needs a tensor dim");
  ExpectRejected("S()", "needs a tensor dim");
  ExpectRejected("S(x)", "tensor dim 'x' is not an integer");
  ExpectRejected("S(1.5)", "'1.5'");
  ExpectRejected("S(99999999999)", "'99999999999'");
  ExpectRejected("S(0", "missing ')'");
  ExpectRejected("S(0,3)", "bracketed list");
  ExpectRejected("S(0,[])", "explicit sizes are empty");
  ExpectRejected("S(0,[3,-1])", "size '-1'");
  ExpectRejected("S(0,[3,,5])", "size ''");
  ExpectRejected("S(0,[a])", "size 'a'");
  ExpectRejected("S(0,[1],[2])", "want S(dim)");
  ExpectRejected("R(0)", "Replicate takes no argument");
  ExpectRejected("P(prod)", "unknown reduce op 'prod'");
  ExpectRejected("Q(0)", "placement 'Q(0)': unknown placement");
  ExpectRejected("S(0),X", "placement 'X'");
}

TEST(ParsePlacementsTest, ToStringRoundTrips) {
  for (const std::string& text : {"S(0),S(0)", "S(-1)", "S(0,[3,5])", "R", "P(sum)", "P(avg)",
                                  "P(min),P(max)", "S(1),R,S(0,[0,2,0])"}) {
    std::vector<Placement> p = MustParse(text);
    EXPECT_EQ(PlacementsToString(p), text);
    EXPECT_EQ(MustParse(PlacementsToString(p)), p);
  }
  // Long forms normalise to the short syntax.
  EXPECT_EQ(PlacementsToString(MustParse("Shard(1),Replicate,Partial(max),P(mean),P")),
            "S(1),R,P(max),P(avg),P(sum)");
  EXPECT_EQ(Placement::Shard(2, {1, 2}).ToString(), "S(2,[1,2])");
}

TEST(ParseFlatSpecTest, GroupsPerRank) {
  absl::StatusOr<FlatSpec> spec = ParseFlatSpec("0:4,20:30;4:20;;");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->size(), 4u);
  EXPECT_THAT((*spec)[0], ElementsAre(FlatRange{0, 4}, FlatRange{20, 30}));
  EXPECT_THAT((*spec)[1], ElementsAre(FlatRange{4, 20}));
  EXPECT_TRUE((*spec)[2].empty());
  EXPECT_TRUE((*spec)[3].empty());
  EXPECT_EQ(FlatSpecToString(*spec), "0:4,20:30;4:20;;");
}

TEST(ParseFlatSpecTest, WhitespaceAndEmptyRanges) {
  absl::StatusOr<FlatSpec> spec = ParseFlatSpec(" 0 : 3 ; ; 3:3 ");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->size(), 3u);
  EXPECT_THAT((*spec)[0], ElementsAre(FlatRange{0, 3}));
  EXPECT_TRUE((*spec)[1].empty());
  EXPECT_THAT((*spec)[2], ElementsAre(FlatRange{3, 3}));
  EXPECT_EQ(FlatSpecToString(*spec), "0:3;;3:3");
}

TEST(ParseFlatSpecTest, RoundTrip) {
  for (const std::string& text : {"0:8", "0:4;4:8", ";0:8", "0:1,2:3,4:5;1:2,3:4;5:8;"}) {
    absl::StatusOr<FlatSpec> spec = ParseFlatSpec(text);
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    EXPECT_EQ(FlatSpecToString(*spec), text);
  }
}

TEST(ParseFlatSpecTest, BadSpecsRejected) {
  struct Case {
    const char* text;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {"0:4;4", "flat range '4' of rank 1 is not start:end"},
           {"0-4", "'0-4'"},
           {"a:4", "'a:4'"},
           {"0:b", "'0:b'"},
           {"0:4:8", "'0:4:8'"},
           {"0:4,", "flat range '' of rank 0"},
           {"0:4,,5:6", "flat range '' of rank 0"},
           {"5:3", "flat range '5:3' of rank 0 needs 0 <= start <= end"},
           {"0:1;-1:3", "flat range '-1:3' of rank 1 needs"},
           {"0:99999999999999999999", "'0:99999999999999999999'"},
       }) {
    absl::StatusOr<FlatSpec> spec = ParseFlatSpec(c.text);
    ASSERT_FALSE(spec.ok()) << "'" << c.text << "' was accepted";
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(c.needle)) << c.text;
  }
}

}  // namespace
}  // namespace shardcoord
