#include "sharding/box_copy.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "sharding/testing/test_util.h"

namespace shardcoord {
namespace {

using sharding_testing::ForEachIndex;
using ::testing::HasSubstr;

// Element offset of global coordinate `idx` in a row-major buffer for `box`.
int64_t LinearIndex(const Box& box, const Shape& idx) {
  int64_t lin = 0;
  for (int d = 0; d < box.ndim(); ++d) lin = lin * box.shape(d) + (idx[d] - box.offset(d));
  return lin;
}

// The obviously correct copy: one memcpy per element.
void NaiveCopy(const Box& region, const char* src, const Box& src_box, char* dst,
               const Box& dst_box, int64_t es) {
  ForEachIndex(region, [&](const Shape& idx) {
    std::memcpy(dst + LinearIndex(dst_box, idx) * es, src + LinearIndex(src_box, idx) * es, es);
  });
}

std::vector<char> RandomBytes(std::mt19937_64& rng, int64_t n) {
  std::vector<char> v(n);
  for (char& c : v) c = static_cast<char>(rng());
  return v;
}

// A box around `region`, grown by 0..2 on each side of each dim; often not grown at all, so
// that trailing dims are spanned fully and runs merge.
Box Around(std::mt19937_64& rng, const Box& region) {
  Shape off = region.offset(), shp = region.shape();
  for (int d = 0; d < region.ndim(); ++d) {
    if (rng() % 2 == 0) continue;
    const int64_t lo = rng() % 3, hi = rng() % 3;
    off[d] -= lo;
    shp[d] += lo + hi;
  }
  return Box(off, shp);
}

TEST(CopyBoxTest, MatchesNaiveCopyOnRandomBoxes) {
  std::mt19937_64 rng(20240601);
  int nonempty = 0;
  for (int ndim = 1; ndim <= 4; ++ndim) {
    for (int64_t es : {1, 2, 4, 8, 3, 16}) {
      for (int trial = 0; trial < 60; ++trial) {
        Shape off(ndim), shp(ndim);
        for (int d = 0; d < ndim; ++d) {
          off[d] = 2 + rng() % 4;
          shp[d] = (trial % 20 == 19 && d == 0) ? 0 : 1 + rng() % 5;  // Sometimes empty.
        }
        const Box region(off, shp);
        const Box src_box = Around(rng, region);
        const Box dst_box = Around(rng, region);
        const std::vector<char> src = RandomBytes(rng, src_box.Volume() * es);
        std::vector<char> dst = RandomBytes(rng, dst_box.Volume() * es);
        std::vector<char> want = dst;
        NaiveCopy(region, src.data(), src_box, want.data(), dst_box, es);
        ASSERT_TRUE(CopyBox(region, src.data(), src_box, dst.data(), dst_box, es).ok());
        ASSERT_EQ(dst, want) << "region " << region.ToString() << " src " << src_box.ToString()
                             << " dst " << dst_box.ToString() << " element size " << es;
        if (!region.Empty()) ++nonempty;
      }
    }
  }
  EXPECT_GT(nonempty, 1000);
}

TEST(CopyBoxTest, FullyContiguousAndPartlyMergedRegions) {
  // Region spans dims 1 and 2 fully in both boxes: one run of 2*3*4 elements.
  const Box src_box({0, 0, 0}, {4, 3, 4});
  const Box dst_box({1, 0, 0}, {2, 3, 4});
  const Box region({1, 0, 0}, {2, 3, 4});
  std::vector<int32_t> src(src_box.Volume());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<int32_t>(i);
  std::vector<int32_t> dst(dst_box.Volume(), -1);
  ASSERT_TRUE(CopyBox(region, src.data(), src_box, dst.data(), dst_box, 4).ok());
  for (size_t i = 0; i < dst.size(); ++i) EXPECT_EQ(dst[i], static_cast<int32_t>(12 + i));

  // Dim 2 is full but dim 1 is not in the source: runs of 4, strided by 12 vs 8.
  const Box region2({1, 1, 0}, {2, 2, 4});
  const Box dst2_box({1, 1, 0}, {2, 2, 4});
  std::vector<int32_t> dst2(dst2_box.Volume(), -1);
  ASSERT_TRUE(CopyBox(region2, src.data(), src_box, dst2.data(), dst2_box, 4).ok());
  const std::vector<int32_t> want2 = {16, 17, 18, 19, 20, 21, 22, 23,
                                      28, 29, 30, 31, 32, 33, 34, 35};
  EXPECT_EQ(dst2, want2);
}

TEST(CopyBoxTest, ScalarAndEmptyRegions) {
  const double x = 2.5;
  double y = 0;
  ASSERT_TRUE(CopyBox(Box(), &x, Box(), &y, Box(), sizeof(double)).ok());
  EXPECT_EQ(y, 2.5);
  // Empty regions copy nothing and accept null buffers.
  EXPECT_TRUE(
      CopyBox(Box({1, 0}, {0, 3}), nullptr, Box({0, 0}, {2, 3}), nullptr, Box({0, 0}, {1, 3}), 4)
          .ok());
  // An empty region need not lie inside the boxes (as Box::Contains).
  EXPECT_TRUE(CopyBox(Box({9}, {0}), nullptr, Box({0}, {2}), nullptr, Box({0}, {2}), 4).ok());
}

TEST(CopyBoxTest, ContainmentAndArgumentErrors) {
  std::vector<char> buf(64);
  absl::Status s = CopyBox(Box({0, 0}, {2, 3}), buf.data(), Box({0, 1}, {2, 3}), buf.data() + 32,
                           Box({0, 0}, {2, 3}), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("[0:2, 0:3]"));
  EXPECT_THAT(s.message(), HasSubstr("source box [0:2, 1:4]"));

  s = CopyBox(Box({1}, {3}), buf.data(), Box({0}, {4}), buf.data() + 32, Box({2}, {4}), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("destination box [2:6]"));

  s = CopyBox(Box({0}, {1}), buf.data(), Box({0, 0}, {1, 1}), buf.data(), Box({0}, {1}), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("differ in rank"));

  s = CopyBox(Box({0}, {1}), buf.data(), Box({0}, {1}), buf.data() + 8, Box({0}, {1}), 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("element size 0"));

  s = CopyBox(Box({0}, {1}), nullptr, Box({0}, {1}), buf.data(), Box({0}, {1}), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  s = CopyBox(Box({0}, {1}), buf.data(), Box({0}, {big}), buf.data(), Box({0}, {1}), 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
}

TEST(CopyBoxTest, PackUnpackRoundTrip) {
  std::mt19937_64 rng(7);
  const Box chunk_box({2, 4, 0}, {3, 5, 6});
  const Box region({3, 5, 1}, {2, 3, 4});
  const int64_t es = 3;
  const std::vector<char> chunk = RandomBytes(rng, chunk_box.Volume() * es);
  std::vector<char> packed(region.Volume() * es);
  ASSERT_TRUE(PackBox(region, chunk.data(), chunk_box, packed.data(), es).ok());
  std::vector<char> want(region.Volume() * es);
  NaiveCopy(region, chunk.data(), chunk_box, want.data(), region, es);
  EXPECT_EQ(packed, want);

  std::vector<char> restored(chunk_box.Volume() * es, 0);
  ASSERT_TRUE(UnpackBox(region, packed.data(), restored.data(), chunk_box, es).ok());
  ForEachIndex(chunk_box, [&](const Shape& idx) {
    const int64_t at = LinearIndex(chunk_box, idx) * es;
    for (int64_t b = 0; b < es; ++b) {
      const char expected = region.Contains(Box(idx, Shape(3, 1))) ? chunk[at + b] : 0;
      ASSERT_EQ(restored[at + b], expected);
    }
  });
}

template <typename T>
void CheckReduce(DType dtype, ReduceOp op, std::mt19937_64& rng) {
  const Box src_box({0, 0}, {4, 5});
  const Box dst_box({1, 1}, {4, 5});
  const Box region({1, 2}, {3, 3});
  // Small integers: exact in every type, so float sums compare exactly.
  std::vector<T> src(src_box.Volume()), dst(dst_box.Volume());
  for (T& v : src)
    v = static_cast<T>(static_cast<int>(rng() % 41) - (std::is_signed_v<T> ? 20 : 0));
  for (T& v : dst)
    v = static_cast<T>(static_cast<int>(rng() % 41) - (std::is_signed_v<T> ? 20 : 0));
  std::vector<T> want = dst;
  ForEachIndex(region, [&](const Shape& idx) {
    T& d = want[LinearIndex(dst_box, idx)];
    const T s = src[LinearIndex(src_box, idx)];
    d = op == ReduceOp::kSum   ? static_cast<T>(d + s)
        : op == ReduceOp::kMin ? std::min(d, s)
                               : std::max(d, s);
  });
  ASSERT_TRUE(ReduceIntoBox(region, src.data(), src_box, dst.data(), dst_box, dtype, op).ok());
  EXPECT_EQ(dst, want) << DTypeName(dtype) << " " << ReduceOpName(op);
}

// 16-bit floats hold small integers exactly; compare through float.
void CheckReduce16(DType dtype, ReduceOp op, std::mt19937_64& rng) {
  auto to = dtype == DType::kF16 ? FloatToHalf : FloatToBFloat16;
  auto from = dtype == DType::kF16 ? HalfToFloat : BFloat16ToFloat;
  const Box box({0}, {16});
  const Box region({3}, {10});
  std::vector<uint16_t> src(16), dst(16);
  for (uint16_t& v : src) v = to(static_cast<float>(static_cast<int>(rng() % 41) - 20));
  for (uint16_t& v : dst) v = to(static_cast<float>(static_cast<int>(rng() % 41) - 20));
  std::vector<float> want(16);
  for (int i = 0; i < 16; ++i) {
    const float d = from(dst[i]), s = from(src[i]);
    want[i] = (i < 3 || i >= 13)     ? d
              : op == ReduceOp::kSum ? d + s
              : op == ReduceOp::kMin ? std::min(d, s)
                                     : std::max(d, s);
  }
  ASSERT_TRUE(ReduceIntoBox(region, src.data(), box, dst.data(), box, dtype, op).ok());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(from(dst[i]), want[i]) << DTypeName(dtype) << " " << i;
}

TEST(ReduceIntoBoxTest, AllTypesAndOps) {
  std::mt19937_64 rng(99);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
    CheckReduce<float>(DType::kF32, op, rng);
    CheckReduce<double>(DType::kF64, op, rng);
    CheckReduce<int32_t>(DType::kI32, op, rng);
    CheckReduce<int64_t>(DType::kI64, op, rng);
    CheckReduce<int8_t>(DType::kI8, op, rng);
    CheckReduce<uint8_t>(DType::kU8, op, rng);
    CheckReduce16(DType::kF16, op, rng);
    CheckReduce16(DType::kBF16, op, rng);
  }
}

TEST(ReduceIntoBoxTest, IntegerSumWrapsAndFloatMinPropagatesNan) {
  const Box b({0}, {2});
  int8_t i8_src[2] = {100, -100}, i8_dst[2] = {100, -100};
  ASSERT_TRUE(ReduceIntoBox(b, i8_src, b, i8_dst, b, DType::kI8, ReduceOp::kSum).ok());
  EXPECT_EQ(i8_dst[0], -56);
  EXPECT_EQ(i8_dst[1], 56);
  uint8_t u8_src[2] = {200, 1}, u8_dst[2] = {100, 2};
  ASSERT_TRUE(ReduceIntoBox(b, u8_src, b, u8_dst, b, DType::kU8, ReduceOp::kSum).ok());
  EXPECT_EQ(u8_dst[0], 44);
  EXPECT_EQ(u8_dst[1], 3);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float f_src[2] = {nan, 1.0f}, f_dst[2] = {1.0f, nan};
  ASSERT_TRUE(ReduceIntoBox(b, f_src, b, f_dst, b, DType::kF32, ReduceOp::kMin).ok());
  EXPECT_TRUE(std::isnan(f_dst[0]));
  EXPECT_TRUE(std::isnan(f_dst[1]));
}

TEST(ReduceIntoBoxTest, RejectsAvgAndBadBoxes) {
  float a[4] = {}, b[4] = {};
  absl::Status s =
      ReduceIntoBox(Box({0}, {4}), a, Box({0}, {4}), b, Box({0}, {4}), DType::kF32, ReduceOp::kAvg);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("avg"));
  s = ReduceIntoBox(Box({0}, {4}), a, Box({1}, {4}), b, Box({0}, {4}), DType::kF32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("source box [1:5]"));
}

TEST(DivideBoxTest, DividesEveryType) {
  int32_t i32[3] = {7, -7, 6};
  ASSERT_TRUE(DivideBox(i32, 3, DType::kI32, 2).ok());
  EXPECT_EQ(i32[0], 3);
  EXPECT_EQ(i32[1], -3);  // Truncates toward zero.
  EXPECT_EQ(i32[2], 3);
  int8_t i8[2] = {100, -128};
  ASSERT_TRUE(DivideBox(i8, 2, DType::kI8, 300).ok());  // Divisor beyond i8's range.
  EXPECT_EQ(i8[0], 0);
  EXPECT_EQ(i8[1], 0);
  int64_t i64[1] = {std::numeric_limits<int64_t>::min()};
  ASSERT_TRUE(DivideBox(i64, 1, DType::kI64, 2).ok());
  EXPECT_EQ(i64[0], std::numeric_limits<int64_t>::min() / 2);
  float f[2] = {7.0f, -1.0f};
  ASSERT_TRUE(DivideBox(f, 2, DType::kF32, 2).ok());
  EXPECT_EQ(f[0], 3.5f);
  EXPECT_EQ(f[1], -0.5f);
  uint16_t h[1] = {FloatToHalf(3.0f)}, bf[1] = {FloatToBFloat16(3.0f)};
  ASSERT_TRUE(DivideBox(h, 1, DType::kF16, 2).ok());
  ASSERT_TRUE(DivideBox(bf, 1, DType::kBF16, 2).ok());
  EXPECT_EQ(HalfToFloat(h[0]), 1.5f);
  EXPECT_EQ(BFloat16ToFloat(bf[0]), 1.5f);
  EXPECT_EQ(DivideBox(f, 2, DType::kF32, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DivideBox(f, -1, DType::kF32, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DivideBox(nullptr, 0, DType::kF32, 2).ok());
}

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // The tie rounds to even: infinity.
  EXPECT_EQ(FloatToHalf(1e10f), 0x7C00);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // Tie to even: zero.
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(HalfToFloat(0xFC00)));
}

TEST(HalfTest, RoundTripsEveryValueAndRoundsTiesToEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f)))) << h;
      continue;
    }
    ASSERT_EQ(FloatToHalf(f), h) << h;
  }
  // Midpoints between neighbouring finite positive halves (exact in float) go to the even
  // one; just off the midpoint goes to the nearer one.
  for (uint32_t h = 0; h < 0x7BFF; ++h) {
    const float lo = HalfToFloat(static_cast<uint16_t>(h));
    const float hi = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (lo + hi) / 2;
    ASSERT_EQ(FloatToHalf(mid), (h & 1) ? h + 1 : h) << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 0.0f)), h) << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 1e9f)), h + 1) << h;
    ASSERT_EQ(FloatToHalf(-mid), 0x8000 | ((h & 1) ? h + 1 : h)) << h;
  }
}

TEST(BFloat16Test, RoundTripsAndRoundsTiesToEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(FloatToBFloat16(-1.0f), 0xBF80);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);  // Rounds up to inf.
  EXPECT_TRUE(
      std::isnan(BFloat16ToFloat(FloatToBFloat16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload lives only in the low 16 bits must not become infinity.
  float low_nan;
  const uint32_t bits = 0x7F800001;
  std::memcpy(&low_nan, &bits, 4);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(low_nan))));
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = BFloat16ToFloat(static_cast<uint16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToBFloat16(f), b) << b;
  }
  for (uint32_t b = 0; b < 0x7F7F; ++b) {
    const float lo = BFloat16ToFloat(static_cast<uint16_t>(b));
    const float hi = BFloat16ToFloat(static_cast<uint16_t>(b + 1));
    const float mid = lo + (hi - lo) / 2;
    ASSERT_EQ(FloatToBFloat16(mid), (b & 1) ? b + 1 : b) << b;
    ASSERT_EQ(FloatToBFloat16(std::nextafter(mid, 0.0f)), b) << b;
    ASSERT_EQ(FloatToBFloat16(std::nextafter(mid, std::numeric_limits<float>::infinity())), b + 1)
        << b;
  }
}

TEST(SplitIntoSlabsTest, CutsTheOutermostNonUnitDim) {
  // 1 x 10 x 4 f32: 16 bytes per index of dim 1; 40 bytes take 2 indices per slab.
  const Box box({3, 5, 0}, {1, 10, 4});
  std::vector<Box> slabs = SplitIntoSlabs(box, 4, 40);
  ASSERT_EQ(slabs.size(), 5u);
  for (size_t i = 0; i < slabs.size(); ++i) {
    EXPECT_EQ(slabs[i], Box({3, 5 + 2 * static_cast<int64_t>(i), 0}, {1, 2, 4}));
  }
  // Uneven tail.
  slabs = SplitIntoSlabs(box, 4, 48);
  ASSERT_EQ(slabs.size(), 4u);
  EXPECT_EQ(slabs.back(), Box({3, 14, 0}, {1, 1, 4}));
}

TEST(SplitIntoSlabsTest, KeepsBoxesThatFitOrCannotBeCut) {
  const Box box({0, 0}, {4, 4});
  EXPECT_EQ(SplitIntoSlabs(box, 8, 128), std::vector<Box>{box});
  EXPECT_EQ(SplitIntoSlabs(box, 8, 1000), std::vector<Box>{box});
  const Box one({2, 2}, {1, 1});
  EXPECT_EQ(SplitIntoSlabs(one, 8, 1), std::vector<Box>{one});
  const Box empty({0, 0}, {0, 5});
  EXPECT_EQ(SplitIntoSlabs(empty, 8, 1), std::vector<Box>{empty});
  // One index of the cut dim exceeds the limit: each row is cut along the next dim.
  std::vector<Box> rows = SplitIntoSlabs(box, 8, 16);
  ASSERT_EQ(rows.size(), 8u);
  EXPECT_EQ(rows[0], Box({0, 0}, {1, 2}));
  EXPECT_EQ(rows[1], Box({0, 2}, {1, 2}));
  EXPECT_EQ(rows[7], Box({3, 2}, {1, 2}));
  // Below one element: one element per slab.
  EXPECT_EQ(SplitIntoSlabs(box, 8, 4).size(), 16u);
}

TEST(SplitIntoSlabsTest, SlabsTileTheBoxAndStayContiguousInAChunk) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int nd = 1 + static_cast<int>(rng() % 4);
    Shape offset(nd), shape(nd);
    int64_t volume = 1;
    for (int d = 0; d < nd; ++d) {
      offset[d] = rng() % 5;
      shape[d] = 1 + rng() % 6;
      volume *= shape[d];
    }
    const Box box(offset, shape);
    const int64_t esize = int64_t{1} << (rng() % 4);
    const int64_t limit = 1 + rng() % (volume * esize + 4);
    std::vector<Box> slabs = SplitIntoSlabs(box, esize, limit);
    int64_t covered = 0;
    for (size_t i = 0; i < slabs.size(); ++i) {
      EXPECT_TRUE(box.Contains(slabs[i])) << box.ToString() << " " << slabs[i].ToString();
      EXPECT_FALSE(slabs[i].Empty());
      for (size_t j = 0; j < i; ++j) EXPECT_FALSE(slabs[i].Overlaps(slabs[j]));
      covered += slabs[i].Volume();
      EXPECT_LE(slabs[i].Volume() * esize, std::max(limit, esize)) << slabs[i].ToString();
    }
    EXPECT_EQ(covered, volume);
    // Row-major order: a dense buffer for the box is the slabs' packed buffers concatenated.
    std::vector<int32_t> whole(static_cast<size_t>(volume));
    for (int64_t i = 0; i < volume; ++i) whole[i] = static_cast<int32_t>(i);
    int64_t at = 0;
    for (const Box& s : slabs) {
      std::vector<int32_t> packed(static_cast<size_t>(s.Volume()));
      ASSERT_TRUE(PackBox(s, whole.data(), box, packed.data(), 4).ok());
      for (int32_t v : packed) EXPECT_EQ(v, at++);
    }
  }
}

TEST(RegionByteRunsTest, RunsGatheredInOrderArePackBox) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int nd = 1 + static_cast<int>(rng() % 4);
    Shape boff(nd), bshape(nd), roff(nd), rshape(nd);
    int64_t volume = 1;
    for (int d = 0; d < nd; ++d) {
      boff[d] = rng() % 4;
      bshape[d] = 1 + rng() % 5;
      roff[d] = boff[d] + rng() % bshape[d];
      rshape[d] = rng() % (boff[d] + bshape[d] - roff[d] + 1);  // May be empty.
      volume *= bshape[d];
    }
    const Box box(boff, bshape), region(roff, rshape);
    std::vector<int16_t> data(static_cast<size_t>(volume));
    for (int64_t i = 0; i < volume; ++i) data[i] = static_cast<int16_t>(i * 3 + 1);
    absl::StatusOr<RegionRuns> runs = RegionByteRuns(region, box, 2);
    ASSERT_TRUE(runs.ok()) << runs.status();
    std::vector<char> gathered;
    for (int64_t off : runs->offsets) {
      const char* p = reinterpret_cast<const char*>(data.data()) + off;
      gathered.insert(gathered.end(), p, p + runs->run_bytes);
    }
    std::vector<char> packed(static_cast<size_t>(region.Volume() * 2));
    ASSERT_TRUE(PackBox(region, data.data(), box, packed.data(), 2).ok());
    EXPECT_EQ(gathered, packed) << region.ToString() << " in " << box.ToString();
    if (region.Empty()) EXPECT_TRUE(runs->offsets.empty());
  }
  // A contiguous region is one run; rows of a column block are one run each.
  EXPECT_EQ(RegionByteRuns(Box({2, 0}, {3, 8}), Box({0, 0}, {8, 8}), 4)->offsets,
            std::vector<int64_t>{64});
  absl::StatusOr<RegionRuns> cols = RegionByteRuns(Box({0, 2}, {3, 2}), Box({0, 0}, {4, 8}), 4);
  EXPECT_EQ(cols->run_bytes, 8);
  EXPECT_EQ(cols->offsets, (std::vector<int64_t>{8, 40, 72}));
  EXPECT_EQ(RegionByteRuns(Box({0, 7}, {1, 2}), Box({0, 0}, {4, 8}), 4).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardcoord
