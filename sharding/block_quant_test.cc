#include "sharding/block_quant.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/cast.h"
#include "sharding/cast_bits.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::ErrorOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// cast_bits' generic per-element conversion (not Cast's fast loops, which the quantizer uses).
uint8_t E4M3(float v) {
  return static_cast<uint8_t>(
      cast_bits::CastElement(cast_bits::F32Bits(v), cast_bits::kF32, cast_bits::kF8E4M3));
}

// An independent reading of the header's rules, element by element: find the element's block
// by its coordinates, scan the block for amax, divide, convert.
void Reference(const std::vector<float>& x, const Shape& shape, const BlockSize& b,
               std::vector<uint8_t>* q, std::vector<float>* s) {
  const int64_t m = shape[shape.size() - 2], n = shape[shape.size() - 1];
  const int64_t outer = static_cast<int64_t>(x.size()) / (m * n);
  const int64_t bm = (m + b.rows - 1) / b.rows, bn = (n + b.cols - 1) / b.cols;
  q->assign(x.size(), 0);
  s->assign(static_cast<size_t>(outer * bm * bn), 0.0f);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < bm; ++i) {
      for (int64_t j = 0; j < bn; ++j) {
        float amax = 0;
        for (int64_t r = i * b.rows; r < std::min(m, (i + 1) * b.rows); ++r) {
          for (int64_t c = j * b.cols; c < std::min(n, (j + 1) * b.cols); ++c) {
            const float v = x[(o * m + r) * n + c];
            if (std::isfinite(v)) amax = std::max(amax, std::fabs(v));
          }
        }
        float scale = amax / 448.0f;
        if (!(scale > 0)) scale = 1;
        (*s)[(o * bm + i) * bn + j] = scale;
        for (int64_t r = i * b.rows; r < std::min(m, (i + 1) * b.rows); ++r) {
          for (int64_t c = j * b.cols; c < std::min(n, (j + 1) * b.cols); ++c) {
            (*q)[(o * m + r) * n + c] = E4M3(x[(o * m + r) * n + c] / scale);
          }
        }
      }
    }
  }
}

TEST(BlockQuantTest, ParsesAndPrintsTheBlockSize) {
  absl::StatusOr<BlockSize> b = ParseBlockQuantization("block:128x64");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->rows, 128);
  EXPECT_EQ(b->cols, 64);
  EXPECT_EQ(BlockQuantizationText(*b), "block:128x64");
  for (const char* bad : {"128x128", "block:128", "block:0x128", "block:axb", "block:1x1x1",
                          "block:128x70000", "tensor:1x1"}) {
    EXPECT_THAT(ErrorOf(ParseBlockQuantization(bad)),
                HasSubstr(std::string("quantization '") + bad + "'"));
  }
}

TEST(BlockQuantTest, ScaleShapeKeepsLeadingDimsAndRoundsUp) {
  absl::StatusOr<Shape> s = BlockScaleShape({256, 7168, 300}, {128, 128});
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(*s, ElementsAre(256, 56, 3));
  EXPECT_THAT(ErrorOf(BlockScaleShape({300}, {128, 128})), HasSubstr("at least two dims"));
}

TEST(BlockQuantTest, SpecialValuesFollowTheRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // One 2x4 tensor, blocks of 2x2: [[896, 3, 0, 0], [inf, NaN, -0.0, 0]] and
  // [[-224, 1e-45, ...]] on the right.
  const std::vector<float> x = {896, 3,   -224, std::ldexp(1.0f, -149),  //
                                inf, nan, -inf, 448};
  std::vector<uint8_t> q(8);
  std::vector<float> s(2);
  ASSERT_TRUE(QuantizeBlocks(x.data(), DType::kF32, {2, 4}, {2, 2}, q.data(), s.data()).ok());
  // Left block: amax 896 (inf and NaN skipped), s = 2: 448, 1.5, inf -> 448, NaN.
  EXPECT_EQ(s[0], 2.0f);
  EXPECT_EQ(q[0], E4M3(448));
  EXPECT_EQ(q[1], E4M3(1.5f));
  EXPECT_EQ(q[4], 0x7E);         // +448: e4m3 has no infinity.
  EXPECT_EQ(q[5] & 0x7F, 0x7F);  // NaN.
  // Right block: amax 448, s = 1: -inf -> -448, the subnormal to 0.
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(q[2], E4M3(-224));
  EXPECT_EQ(q[3], 0x00);
  EXPECT_EQ(q[6], 0xFE);
  EXPECT_EQ(q[7], 0x7E);

  // All zeros (and no finite element at all) give s = 1; an amax whose s underflows too.
  const std::vector<float> zeros = {0, -0.0f, nan, inf, std::ldexp(1.0f, -149), 0, 0, 0};
  ASSERT_TRUE(QuantizeBlocks(zeros.data(), DType::kF32, {2, 4}, {2, 2}, q.data(), s.data()).ok());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(q[0], 0x00);
  EXPECT_EQ(q[1], 0x80);  // -0 keeps its sign.
}

TEST(BlockQuantTest, AgreesWithAnElementwiseReferenceOnUnevenBlocks) {
  std::mt19937 rng(28);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const Shape& shape : {Shape{5, 7}, Shape{3, 130, 260}, Shape{1, 1}, Shape{128, 128}}) {
    for (const BlockSize b : {BlockSize{128, 128}, BlockSize{2, 3}, BlockSize{1, 128}}) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> x(static_cast<size_t>(n));
      std::uniform_int_distribution<int> exponent(-20, 20);
      for (float& v : x) v = std::ldexp(normal(rng), exponent(rng) / 4);
      if (n > 3) x[3] = 0;
      std::vector<uint8_t> want_q, got_q(x.size());
      std::vector<float> want_s;
      Reference(x, shape, b, &want_q, &want_s);
      std::vector<float> got_s(want_s.size());
      ASSERT_TRUE(QuantizeBlocks(x.data(), DType::kF32, shape, b, got_q.data(), got_s.data()).ok());
      EXPECT_EQ(got_q, want_q) << shape.size() << " dims, block " << BlockQuantizationText(b);
      EXPECT_EQ(got_s, want_s);

      // Dequantizing to f32 is f32(q) * s; every normal value comes back within e4m3's
      // precision (3 mantissa bits) of the block's scale-relative value.
      std::vector<float> y(x.size());
      ASSERT_TRUE(
          DequantizeBlocks(got_q.data(), got_s.data(), shape, b, y.data(), DType::kF32).ok());
      const int64_t m = shape[shape.size() - 2], cols = shape.back();
      const int64_t bn = (cols + b.cols - 1) / b.cols, bm = (m + b.rows - 1) / b.rows;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t c = i % cols, r = (i / cols) % m, o = i / (cols * m);
        const float scale = got_s[(o * bm + r / b.rows) * bn + c / b.cols];
        float qf = 0;
        ASSERT_TRUE(Cast(&got_q[i], DType::kF8E4M3, &qf, DType::kF32, 1).ok());
        ASSERT_EQ(y[i], qf * scale) << i;
        EXPECT_LE(std::fabs(y[i] - x[i]), std::max(std::fabs(x[i]) / 16, scale / 512)) << i;
      }
    }
  }
}

// Every e4m3 pattern under scales that reach every corner of the targets (f32 subnormal
// products, bf16/f16 overflow to infinity, e5m2 saturation, ties after the product) and
// every target dtype: dequantizing equals cast_bits' element steps, f32(q) * s in f32 then
// the generic f32 -> dtype conversion.
TEST(BlockQuantTest, DequantizeEveryPatternToEveryDtypeAsTheElementRule) {
  const std::vector<float> block_scales = {1.0f,
                                           2.0f / 448.0f,
                                           std::ldexp(1.0f, -140),
                                           std::ldexp(1.7f, -130),
                                           1.0f / 3.0f,
                                           std::ldexp(1.0f, 120),
                                           300.0f,
                                           1.0078125f,
                                           std::ldexp(1.0f, -20)};
  const int64_t bc = static_cast<int64_t>(block_scales.size());
  const BlockSize b{2, 256};
  const Shape shape = {3, 2 * 2, 256 * bc};  // Two block rows; each row holds every pattern.
  const int64_t n = 3 * 4 * 256 * bc;
  std::vector<uint8_t> q(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) q[i] = static_cast<uint8_t>((i * 7 + i / (256 * bc)) & 0xFF);
  std::vector<float> s(static_cast<size_t>(3 * 2 * bc));
  for (size_t i = 0; i < s.size(); ++i) s[i] = block_scales[(i + i / bc) % bc];
  for (DType to :
       {DType::kBF16, DType::kF32, DType::kF16, DType::kF64, DType::kF8E5M2, DType::kF8E4M3}) {
    std::vector<unsigned char> y(static_cast<size_t>(n * ElementSize(to)));
    ASSERT_TRUE(DequantizeBlocks(q.data(), s.data(), shape, b, y.data(), to).ok());
    int failures = 0;
    for (int64_t i = 0; i < n && failures < 5; ++i) {
      const int64_t c = i % (256 * bc), r = (i / (256 * bc)) % 4, o = i / (256 * bc * 4);
      const float scale = s[(o * 2 + r / 2) * bc + c / 256];
      const float v = cast_bits::DequantizeE4M3(q[i], scale);
      const uint64_t want =
          cast_bits::CastElement(cast_bits::F32Bits(v), cast_bits::kF32, static_cast<int>(to));
      uint64_t got = 0;
      std::memcpy(&got, &y[i * ElementSize(to)], ElementSize(to));
      if (got != want) {
        ++failures;
        ADD_FAILURE() << DTypeName(to) << " element " << i << " q 0x" << std::hex << int{q[i]}
                      << " scale " << scale << ": got 0x" << got << ", want 0x" << want;
      }
    }
  }
}

// Quantizing from every source dtype with every special value (NaN, +-inf, -0, subnormals of
// f32 and of the source, values whose x / s ties in e4m3, the largest finite) equals
// cast_bits' element steps: amax, BlockScale, QuantizeE4M3 with the generic conversion.
TEST(BlockQuantTest, QuantizeSpecialValuesFromEveryDtypeAsTheElementRule) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> specials = {0.0f,
                                 -0.0f,
                                 inf,
                                 -inf,
                                 std::numeric_limits<float>::quiet_NaN(),
                                 -std::numeric_limits<float>::quiet_NaN(),
                                 std::numeric_limits<float>::denorm_min(),
                                 std::numeric_limits<float>::min(),
                                 1.0625f,
                                 -1.1875f,
                                 464.0f,
                                 -480.0f,
                                 std::ldexp(1.0f, -10),
                                 std::ldexp(3.0f, -10),
                                 65504.0f,
                                 1e30f,
                                 -3.0e38f,
                                 std::ldexp(1.0f, -24),
                                 0.3f,
                                 -7.75f};
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  while (specials.size() < 8 * 24) specials.push_back(std::ldexp(normal(rng), exponent(rng)));
  const BlockSize b{3, 5};
  const Shape shape = {8, 24};
  for (DType from :
       {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kF8E4M3, DType::kF8E5M2}) {
    std::vector<unsigned char> x(specials.size() * ElementSize(from));
    ASSERT_TRUE(
        Cast(specials.data(), DType::kF32, x.data(), from, static_cast<int64_t>(specials.size()))
            .ok());
    std::vector<float> xf(specials.size());  // The source as f32 (cast.h's, exact or rounded).
    ASSERT_TRUE(
        Cast(x.data(), from, xf.data(), DType::kF32, static_cast<int64_t>(specials.size())).ok());
    std::vector<uint8_t> want_q, got_q(specials.size());
    std::vector<float> want_s;
    Reference(xf, shape, b, &want_q, &want_s);
    std::vector<float> got_s(want_s.size());
    ASSERT_TRUE(QuantizeBlocks(x.data(), from, shape, b, got_q.data(), got_s.data()).ok());
    EXPECT_EQ(got_q, want_q) << DTypeName(from);
    EXPECT_EQ(got_s, want_s) << DTypeName(from);
  }
}

TEST(BlockQuantTest, OtherDtypesGoThroughF32) {
  // bf16 in, bf16 out: the bf16 result is cast.h's f32 -> bf16 of f32(q) * s.
  const std::vector<float> f = {1.0f, -3.5f, 1000.0f, 0.0078125f};
  std::vector<uint16_t> bf(4);
  ASSERT_TRUE(Cast(f.data(), DType::kF32, bf.data(), DType::kBF16, 4).ok());
  std::vector<uint8_t> q(4);
  std::vector<float> s(1);
  ASSERT_TRUE(QuantizeBlocks(bf.data(), DType::kBF16, {2, 2}, {2, 2}, q.data(), s.data()).ok());
  EXPECT_EQ(s[0], 1000.0f / 448.0f);
  std::vector<uint16_t> back(4);
  ASSERT_TRUE(DequantizeBlocks(q.data(), s.data(), {2, 2}, {2, 2}, back.data(), DType::kBF16).ok());
  for (int i = 0; i < 4; ++i) {
    float qf = 0;
    ASSERT_TRUE(Cast(&q[i], DType::kF8E4M3, &qf, DType::kF32, 1).ok());
    const float y = qf * s[0];
    uint16_t want = 0;
    ASSERT_TRUE(Cast(&y, DType::kF32, &want, DType::kBF16, 1).ok());
    EXPECT_EQ(back[i], want) << i;
  }
  EXPECT_THAT(ErrorOf(absl::StatusOr<int>(
                  QuantizeBlocks(bf.data(), DType::kI32, {2, 2}, {2, 2}, q.data(), s.data()))),
              HasSubstr("src dtype i32 cannot be block-quantized"));
  EXPECT_THAT(ErrorOf(absl::StatusOr<int>(
                  DequantizeBlocks(q.data(), s.data(), {4}, {2, 2}, back.data(), DType::kBF16))),
              HasSubstr("at least two dims"));
}

}  // namespace
}  // namespace shardcoord
