#include "sharding/fill.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace shardcoord {
namespace {

TEST(FillTest, ValuesDependOnlyOnFlatIndex) {
  EXPECT_EQ(FillValue(FillKind::kZeros, 1, 7), 0.0);
  EXPECT_EQ(FillValue(FillKind::kArange, 1, 7), 7.0);
  const double r = FillValue(FillKind::kRandom, 42, 7);
  EXPECT_GE(r, 0.0);
  EXPECT_LT(r, 1.0);
  EXPECT_EQ(r, FillValue(FillKind::kRandom, 42, 7));
  EXPECT_NE(r, FillValue(FillKind::kRandom, 43, 7));
  EXPECT_NE(r, FillValue(FillKind::kRandom, 42, 8));
}

TEST(FillTest, FillBoxMatchesFlatIndices) {
  const Shape shape = {4, 5, 6};
  const Box box({1, 2, 3}, {2, 3, 2});
  std::vector<float> out(box.Volume());
  ASSERT_TRUE(FillBox(FillKind::kArange, 0, shape, box, DType::kF32, out.data()).ok());
  int64_t i = 0;
  for (int64_t a = 1; a < 3; ++a)
    for (int64_t b = 2; b < 5; ++b)
      for (int64_t c = 3; c < 5; ++c) EXPECT_EQ(out[i++], static_cast<float>(a * 30 + b * 6 + c));

  std::vector<double> rnd(box.Volume());
  ASSERT_TRUE(FillBox(FillKind::kRandom, 9, shape, box, DType::kF64, rnd.data()).ok());
  EXPECT_EQ(rnd[0], FillValue(FillKind::kRandom, 9, 1 * 30 + 2 * 6 + 3));
}

TEST(FillTest, FillBoxRejectsOutOfBounds) {
  std::vector<float> out(8);
  EXPECT_EQ(FillBox(FillKind::kArange, 0, {4}, Box({2}, {3}), DType::kF32, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FillBox(FillKind::kArange, 0, {4, 4}, Box({0}, {3}), DType::kF32, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FillTest, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalf(f), h) << h;
  }
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7c00);                // Overflow to +inf.
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00);  // Tie rounds to even.
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);
}

TEST(FillTest, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  std::mt19937 gen(7);
  for (int i = 0; i < 10000; ++i) {
    const uint16_t b = static_cast<uint16_t>(gen());
    const float f = BFloat16ToFloat(b);
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToBFloat16(f), b);
  }
  // 1 + 2^-8 is exactly between 1 and 1 + 2^-7: ties to the even mantissa (1.0).
  EXPECT_EQ(FloatToBFloat16(1.0f + 1.0f / 256), 0x3f80);
}

TEST(FillTest, LoadStoreEveryDType) {
  for (DType t : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI8, DType::kU8,
                  DType::kI32, DType::kI64}) {
    std::vector<char> buf(ElementSize(t) * 3);
    StoreFromDouble(buf.data(), t, 2, 5.0);
    EXPECT_EQ(LoadAsDouble(buf.data(), t, 2), 5.0) << DTypeName(t);
  }
}

}  // namespace
}  // namespace shardcoord
