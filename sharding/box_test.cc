#include "sharding/box.h"

#include <limits>

#include "gtest/gtest.h"
#include "sharding/dtype.h"

namespace shardcoord {
namespace {

TEST(BoxTest, IntersectionContainmentVolume) {
  Box a({0, 0}, {4, 4});
  Box b({2, 3}, {4, 4});
  EXPECT_EQ(a.Volume(), 16);
  EXPECT_TRUE(a.Overlaps(b));
  EXPECT_EQ(a.Intersect(b), Box({2, 3}, {2, 1}));
  EXPECT_TRUE(a.Contains(Box({1, 1}, {2, 2})));
  EXPECT_FALSE(a.Contains(b));
  Box c({4, 0}, {1, 4});
  EXPECT_FALSE(a.Overlaps(c));
  EXPECT_TRUE(a.Intersect(c).Empty());
  EXPECT_TRUE(a.Contains(Box({9, 9}, {0, 3})));  // Empty boxes are contained anywhere.
  EXPECT_FALSE(Box({0}, {0}).Overlaps(Box({0}, {1})));
  EXPECT_EQ(a.ToString(), "[0:4, 0:4]");
}

// Found by sharding:placement_fuzz: ValidateShape accepts [huge, huge, 0], whose volume is 0.
TEST(BoxTest, VolumeWithAZeroDimDoesNotOverflow) {
  const int64_t big = int64_t{1} << 40;
  ASSERT_TRUE(ValidateShape({big, big, 0}).ok());
  EXPECT_EQ(Box::Whole({big, big, 0}).Volume(), 0);
  EXPECT_EQ(Box({0, 0, 0}, {big, big, 0}).Volume(), 0);
}

// Found by sharding:planner_fuzz: planning a tensor of shape [0, 2^40, 2^40] took strides
// whose product overflowed.
TEST(BoxTest, RowMajorStridesOfAnEmptyShapeDoNotOverflow) {
  const int64_t big = int64_t{1} << 40;
  ASSERT_TRUE(ValidateShape({0, big, big}).ok());
  EXPECT_EQ(RowMajorStrides({0, big, big}), (Shape{0, big, 1}));
  EXPECT_EQ(RowMajorStrides({2, 3, 4}), (Shape{12, 4, 1}));
}

TEST(BoxTest, InBounds) {
  EXPECT_TRUE(Box({2, 0}, {2, 4}).InBounds({4, 4}));
  EXPECT_FALSE(Box({3, 0}, {2, 4}).InBounds({4, 4}));
  EXPECT_FALSE(Box({0}, {1}).InBounds({4, 4}));
  EXPECT_TRUE(Box({4}, {0}).InBounds({4}));  // An empty shard at the end of the extent.
}

TEST(BoxTest, CreateRejectsBadInput) {
  EXPECT_EQ(Box::Create({0}, {1, 2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Box::Create({-1}, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(Box::Create({big}, {1}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Box::Create({0, 0}, {big, 2}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(Box::Create({0, 0}, {big, 1}).ok());
}

TEST(CheckedMathTest, OverflowIsInvalidArgument) {
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(CheckedMul(big, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckedAdd(big, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*CheckedMul(3, 4), 12);
  EXPECT_EQ(CheckedProduct({1 << 30, 1 << 30, 1 << 30}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*CheckedProduct({1 << 30, 1 << 30, 0}), 0);
  EXPECT_EQ(*CheckedProduct({}), 1);
  EXPECT_EQ(CheckedBytes({int64_t{1} << 62}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*CheckedBytes({8, 4}, 4), 128);
  EXPECT_EQ(ValidateShape({2, -1}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckedMathTest, RowMajorStrides) {
  EXPECT_EQ(RowMajorStrides({2, 3, 4}), (Shape{12, 4, 1}));
  EXPECT_EQ(RowMajorStrides({}), Shape{});
}

TEST(DTypeTest, ParseAndSize) {
  EXPECT_EQ(*ParseDType("f32"), DType::kF32);
  EXPECT_EQ(*ParseDType("bfloat16"), DType::kBF16);
  EXPECT_EQ(ElementSize(DType::kBF16), 2);
  EXPECT_EQ(DTypeName(DType::kI64), "i64");
  EXPECT_EQ(ParseDType("f33").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardcoord
