#include "common/coordinator_addresses.h"

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(SplitAddressesTest, TrimsAndDropsEmpty) {
  EXPECT_EQ(SplitAddresses(" a:1, b:2,,c:3 "), (std::vector<std::string>{"a:1", "b:2", "c:3"}));
  EXPECT_TRUE(SplitAddresses("").empty());
}

TEST(CoordinatorAddressesTest, OneAddressStaysPut) {
  CoordinatorAddresses a("a:1");
  EXPECT_EQ(a.size(), 1u);
  a.Unavailable(0, "");
  EXPECT_EQ(a.current(), 0u);
  EXPECT_EQ(a.at(0), "a:1");
}

TEST(CoordinatorAddressesTest, RotatesWithoutAHintAndFollowsOne) {
  CoordinatorAddresses a("a:1,b:2,c:3");
  EXPECT_EQ(a.current(), 0u);
  a.Unavailable(0, "");  // a:1 down: try b:2.
  EXPECT_EQ(a.current(), 1u);
  a.Unavailable(1, "c:3");  // b:2 is a standby naming c:3.
  EXPECT_EQ(a.at(a.current()), "c:3");
  a.Unavailable(2, "c:3");  // The leader itself is busy (a tensor recovering): stay.
  EXPECT_EQ(a.current(), 2u);
  a.Unavailable(2, "");  // c:3 does not answer: move on.
  EXPECT_EQ(a.current(), 0u);
}

TEST(CoordinatorAddressesTest, AnotherCallAlreadyMovedOn) {
  CoordinatorAddresses a("a:1,b:2");
  a.Unavailable(0, "b:2");
  a.Unavailable(0, "");  // A call that started on a:1 before the move: ignored.
  EXPECT_EQ(a.current(), 1u);
  a.Succeeded(1);
  EXPECT_EQ(a.current(), 1u);
}

TEST(CoordinatorAddressesTest, ALeaderOutsideTheListIsAdded) {
  CoordinatorAddresses a("a:1");
  a.Unavailable(0, "10.0.0.9:7400");
  EXPECT_EQ(a.size(), 2u);
  EXPECT_EQ(a.at(a.current()), "10.0.0.9:7400");
  EXPECT_EQ(a.list(), "a:1");
}

}  // namespace
}  // namespace shardcoord
