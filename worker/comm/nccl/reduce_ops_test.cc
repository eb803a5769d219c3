// The reduce-into kernel's element math (reduce_ops.h), run on the host as the kernel runs
// it, against sharding/box_copy.h's ReduceIntoBox: bitwise equal results.
#include "worker/comm/nccl/reduce_ops.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "sharding/box.h"
#include "sharding/box_copy.h"
#include "sharding/dtype.h"
#include "sharding/placement.h"
#include "worker/comm/nccl/box_geometry.h"
#include "worker/comm/nccl/box_geometry_builder.h"

namespace shardcoord {
namespace nccl {
namespace {

static_assert(kDevF32 == static_cast<int>(DType::kF32) &&
              kDevF64 == static_cast<int>(DType::kF64) &&
              kDevF16 == static_cast<int>(DType::kF16) &&
              kDevBF16 == static_cast<int>(DType::kBF16) &&
              kDevI8 == static_cast<int>(DType::kI8) && kDevU8 == static_cast<int>(DType::kU8) &&
              kDevI32 == static_cast<int>(DType::kI32) && kDevI64 == static_cast<int>(DType::kI64));
static_assert(kDevSum == static_cast<int>(ReduceOp::kSum) &&
              kDevMin == static_cast<int>(ReduceOp::kMin) &&
              kDevMax == static_cast<int>(ReduceOp::kMax));

uint32_t Bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

TEST(ReduceOpsTest, HalfAndBFloat16ToFloatMatchHostForEveryValue) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    ASSERT_EQ(Bits(DevHalfToFloat(static_cast<uint16_t>(h))),
              Bits(HalfToFloat(static_cast<uint16_t>(h))))
        << h;
    ASSERT_EQ(Bits(DevBFloat16ToFloat(static_cast<uint16_t>(h))),
              Bits(BFloat16ToFloat(static_cast<uint16_t>(h))))
        << h;
  }
}

TEST(ReduceOpsTest, FloatToHalfAndBFloat16MatchHost) {
  std::mt19937 rng(11);
  std::vector<uint32_t> inputs = {0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001,
                                  0x477FF000, 0x477FEFFF, 0x33000000, 0x33000001, 0x38800000,
                                  0x387FFFFF, 0x3F800000, 0x7F7FFFFF};
  for (int i = 0; i < 1000000; ++i) inputs.push_back(rng());
  // Every half value's neighbourhood, where rounding ties live.
  for (uint32_t h = 0; h < 0x7C00; h += 7) {
    const uint32_t x = Bits(HalfToFloat(static_cast<uint16_t>(h)));
    for (uint32_t d : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u}) inputs.push_back(x + d);
  }
  for (uint32_t x : inputs) {
    float f;
    std::memcpy(&f, &x, 4);
    ASSERT_EQ(DevFloatToHalf(f), FloatToHalf(f)) << std::hex << x;
    ASSERT_EQ(DevFloatToBFloat16(f), FloatToBFloat16(f)) << std::hex << x;
  }
}

// Equal bytes, except that two NaNs are equal: a NaN made by a float sum has no specified
// payload (see reduce_ops.h).
::testing::AssertionResult SameElements(DType dtype, const std::vector<unsigned char>& got,
                                        const std::vector<unsigned char>& want) {
  const int64_t esize = ElementSize(dtype);
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < got.size(); i += esize) {
    const int d = static_cast<int>(dtype);
    if (DevIsNaNElement(d, &got[i]) && DevIsNaNElement(d, &want[i])) continue;
    if (std::memcmp(&got[i], &want[i], esize) != 0) {
      return ::testing::AssertionFailure() << "element " << i / esize << " differs";
    }
  }
  return ::testing::AssertionSuccess();
}

// What the reduce kernel does: one thread per element.
void EmulateReduce(const BoxCopyGeometry& g, int dtype, int op, const unsigned char* src,
                   unsigned char* dst) {
  const int64_t n = ElementCount(g);
  for (int64_t e = 0; e < n; ++e) {
    int64_t s, d;
    ElementOffsets(g, e, &s, &d);
    DevCombineElement(dtype, op, dst + d, src + s);
  }
}

class ReduceIntoTest : public ::testing::TestWithParam<DType> {};

TEST_P(ReduceIntoTest, RandomRegionsMatchReduceIntoBoxBitwise) {
  const DType dtype = GetParam();
  const int64_t esize = ElementSize(dtype);
  EXPECT_EQ(DevElementSize(static_cast<int>(dtype)), esize);
  std::mt19937 rng(1000 + static_cast<int>(dtype));
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    for (int iter = 0; iter < 200; ++iter) {
      // A source chunk and a destination chunk overlapping in `region`.
      const Box src_box({0, 0},
                        {2 + static_cast<int64_t>(rng() % 6), 2 + static_cast<int64_t>(rng() % 6)});
      const Box dst_box({static_cast<int64_t>(rng() % 2), static_cast<int64_t>(rng() % 2)},
                        {1 + static_cast<int64_t>(rng() % 6), 1 + static_cast<int64_t>(rng() % 6)});
      const Box region = src_box.Intersect(dst_box);
      if (region.Empty()) continue;
      std::vector<unsigned char> src(src_box.Volume() * esize), want(dst_box.Volume() * esize);
      // Random bits: NaNs, infinities, subnormals and wrap-around sums all occur; some
      // elements are copied between the buffers so ties and equal NaNs occur too.
      for (auto& b : src) b = static_cast<unsigned char>(rng());
      for (auto& b : want) b = static_cast<unsigned char>(rng());
      std::vector<unsigned char> got = want;
      ASSERT_TRUE(ReduceIntoBox(region, src.data(), src_box, want.data(), dst_box, dtype, op).ok());
      absl::StatusOr<BoxCopyGeometry> g = MakeBoxCopyGeometry(region, src_box, dst_box, esize);
      ASSERT_TRUE(g.ok()) << g.status();
      EmulateReduce(*g, static_cast<int>(dtype), static_cast<int>(op), src.data(), got.data());
      if (op == ReduceOp::kSum) {
        ASSERT_TRUE(SameElements(dtype, got, want))
            << DTypeName(dtype) << " sum " << region.ToString();
      } else {
        // Min and max pick an input: NaN payloads included, bit for bit.
        ASSERT_EQ(got, want) << DTypeName(dtype) << " " << ReduceOpName(op) << " "
                             << region.ToString();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, ReduceIntoTest,
                         ::testing::Values(DType::kF32, DType::kF64, DType::kF16, DType::kBF16,
                                           DType::kI8, DType::kU8, DType::kI32, DType::kI64,
                                           DType::kU32, DType::kU64),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return DTypeName(info.param);
                         });

TEST(ReduceOpsTest, NaNDetectionPerDType) {
  const unsigned char f32_nan[4] = {1, 0, 0x80, 0x7F}, f32_inf[4] = {0, 0, 0x80, 0x7F};
  EXPECT_TRUE(DevIsNaNElement(kDevF32, f32_nan));
  EXPECT_FALSE(DevIsNaNElement(kDevF32, f32_inf));
  const unsigned char f16_nan[2] = {1, 0xFC}, f16_inf[2] = {0, 0x7C};
  EXPECT_TRUE(DevIsNaNElement(kDevF16, f16_nan));
  EXPECT_FALSE(DevIsNaNElement(kDevF16, f16_inf));
  const unsigned char bf16_nan[2] = {0xC1, 0x7F};
  EXPECT_TRUE(DevIsNaNElement(kDevBF16, bf16_nan));
  EXPECT_FALSE(DevIsNaNElement(kDevI32, f32_nan));
}

TEST(ReduceOpsTest, FloatMinMaxPropagateNaNAndIntegerSumsWrap) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(DevCombineFloat<float>(kDevMin, 1.0f, nan)));
  EXPECT_TRUE(std::isnan(DevCombineFloat<float>(kDevMax, nan, 1.0f)));
  EXPECT_EQ(DevCombineFloat<float>(kDevMin, 2.0f, -3.0f), -3.0f);
  EXPECT_EQ((DevCombineInt<int8_t, uint8_t>(kDevSum, 127, 1)), -128);
  EXPECT_EQ((DevCombineInt<int64_t, uint64_t>(kDevMax, -5, 3)), 3);
}

}  // namespace
}  // namespace nccl
}  // namespace shardcoord
